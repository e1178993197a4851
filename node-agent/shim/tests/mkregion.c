/*
 * mkregion — write a region (both files) the way the node agent does, for the shell test runner.
 *   mkregion <dir> <limit bytes> <share %> <control> <extra header flags> [major version]
 */
#include "nn_test.h"

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s <dir> <limit> <share> <control> <flags> [major]\n", argv[0]);
        return 64;
    }
    nn_test_region_spec spec = {.devices = 1};
    spec.limit_bytes[0] = strtoull(argv[2], NULL, 10);
    spec.share[0] = (uint32_t)strtoul(argv[3], NULL, 10);
    spec.control = (uint32_t)strtoul(argv[4], NULL, 10);
    spec.flags = (uint32_t)strtoul(argv[5], NULL, 10);
    nn_test_region r = nn_test_region_create(argv[1], &spec);
    if (argc == 7) { /* both files of another major version */
        r.control->header.version_major = (uint16_t)strtoul(argv[6], NULL, 10);
        r.state->header.version_major = r.control->header.version_major;
    }
    return 0;
}
