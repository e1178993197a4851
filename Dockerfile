# NeuroNetes: one image for every component (pick with the command): `neuronetes` (CLI, operator,
# webhook, extender, node agent), the NRI plugin `neuronetes-nri`, and the CUDA shim the agent
# installs onto its node from /usr/lib/neuronetes/libneuronetes-cuda.so (`--shim-library`).
#
# Every build step is a stage of hack/build-image-contents.sh, which `bash hack/test.sh` also runs
# outside a container into build/image and smoke-tests; tests/unit/test_image.py checks that this
# file runs exactly the script's stages, in order.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG GO_IMAGE=golang:1.26-bookworm

# ---- the NRI plugin (Go, static) ------------------------------------------------------------
FROM ${GO_IMAGE} AS nri
WORKDIR /src
COPY hack/build-image-contents.sh hack/
COPY node-agent/nri node-agent/nri
RUN bash hack/build-image-contents.sh nri /out

# ---- the CUDA shim (C, against the CUDA/NVML headers the dev extra pins) ----------------------
FROM ${PYTHON_IMAGE} AS shim
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml ./
COPY hack/build-image-contents.sh hack/
COPY node-agent/shim node-agent/shim
RUN bash hack/build-image-contents.sh shim-headers
RUN bash hack/build-image-contents.sh shim /out

# ---- the wheel --------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY . .
RUN bash hack/build-image-contents.sh wheel /out

# ---- the image: the wheel in a venv, the plugin and the shim, run as a non-root user ----------
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/neuronetes/bin:$PATH
COPY hack/build-image-contents.sh /tmp/build-image-contents.sh
COPY --from=wheel /out/wheels /tmp/wheels
RUN bash /tmp/build-image-contents.sh venv / /tmp/wheels \
    && rm -rf /tmp/wheels /tmp/build-image-contents.sh
COPY --from=nri /out/ /
COPY --from=shim /out/ /
# Run from a folder that holds no source, so nothing can shadow a module; numeric user and group,
# so `runAsNonRoot` can check them without a passwd entry.
WORKDIR /
USER 65532:65532
ENTRYPOINT ["neuronetes"]
CMD ["--help"]
