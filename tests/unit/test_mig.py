"""MIG profile catalog and NVIDIA's placement rules."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuronetes.mig import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    MigCatalog,
    MigConfigError,
    MigLayout,
    MigPlacementError,
    MigProfile,
    PlacedInstance,
    UnsupportedGpuError,
    catalog_for,
    catalogs,
    format_mig_config,
    is_mig_capable,
    is_valid_profile_name,
    normalize_profile_name,
    parse_mig_config,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def a100_40() -> MigCatalog:
    return catalog_for("A100-SXM4-40GB")


@pytest.fixture
def a100_80() -> MigCatalog:
    return catalog_for("A100-80GB")


def fill(catalog: MigCatalog, *names: str) -> MigLayout:
    layout = catalog.empty_layout()
    for name in names:
        layout = layout.place(name)
    return layout


# -- catalog ------------------------------------------------------------------------


def test_profile_names_match_reference() -> None:
    assert set(catalog_for("A100-40GB").names) == {
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    }
    expected_80 = {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}
    assert set(catalog_for("A100-80GB").names) == expected_80
    assert set(catalog_for("H100-80GB").names) == expected_80


@pytest.mark.parametrize(
    ("name", "max_instances"),
    [
        ("1g.5gb", 7),
        ("1g.5gb+me", 1),
        ("1g.10gb", 4),
        ("2g.10gb", 3),
        ("3g.20gb", 2),
        ("4g.20gb", 1),
        ("7g.40gb", 1),
    ],
)
def test_a100_40gb_max_instances(a100_40: MigCatalog, name: str, max_instances: int) -> None:
    profile = a100_40.profile(name)
    assert profile.max_instances == max_instances
    # The maximum is reachable on an empty GPU, and one more never fits.
    layout = fill(a100_40, *[name] * max_instances)
    assert len(layout) == max_instances
    assert layout.can_place(name) is None


@pytest.mark.parametrize(
    ("name", "size", "starts", "compute"),
    [
        ("7g.40gb", 8, (0,), 7),
        ("4g.20gb", 4, (0,), 4),
        ("3g.20gb", 4, (0, 4), 3),
        ("2g.10gb", 2, (0, 2, 4), 2),
        ("1g.10gb", 2, (0, 2, 4, 6), 1),
        ("1g.5gb", 1, tuple(range(7)), 1),
        ("1g.5gb+me", 1, tuple(range(7)), 1),
    ],
)
def test_a100_40gb_documented_placements(
    a100_40: MigCatalog, name: str, size: int, starts: tuple[int, ...], compute: int
) -> None:
    profile = a100_40.profile(name)
    assert (profile.memory_slices, profile.starts, profile.compute_slices) == (size, starts, compute)


def test_usable_memory_is_below_the_name(a100_40: MigCatalog) -> None:
    assert a100_40.profile("1g.5gb").memory_mib == 4864  # 4.75 GiB
    assert a100_40.profile("1g.10gb").memory_mib == 9856
    for catalog in catalogs():
        for profile in catalog:
            named_gb = int(profile.name.split(".")[1].split("gb")[0])
            assert 0.9 * named_gb * 1000 * 1000 / 1024 < profile.memory_mib < named_gb * 1024


def test_profile_lookup_spellings(a100_40: MigCatalog) -> None:
    me = a100_40.profile("1g.5gb+me")
    assert a100_40.profile("MIG 1g.5gb+me") is me
    assert a100_40.profile("1g.5gb.me") is me
    assert a100_40.profile("nvidia.com/mig-1g.5gb.me") is me
    assert a100_40.profile("neuronetes.io/mig-1G.5GB") is a100_40.profile("1g.5gb")
    assert me.resource_name == "1g.5gb.me"
    assert "3g.20gb" in a100_40
    assert "3g.40gb" not in a100_40
    assert 3 not in a100_40


def test_unknown_profile_lists_valid_ones(a100_40: MigCatalog) -> None:
    with pytest.raises(KeyError, match=r"A100-40GB has no MIG profile '3g.40gb'.*1g\.5gb"):
        a100_40.profile("3g.40gb")


@pytest.mark.parametrize(
    ("model", "canonical"),
    [
        ("A100-SXM4-40GB", "A100-40GB"),
        ("A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),  # GPU feature discovery label spelling
        ("A100-40GB", "A100-40GB"),
        ("A100-80GB", "A100-80GB"),
        ("A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("a100_80gb", "A100-80GB"),
        ("H100-80GB", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("H100-SXM5-80GB", "H100-80GB"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA-H200", "H200"),
        ("NVIDIA H200 NVL", "H200"),
        ("H200-141GB", "H200"),
    ],
)
def test_catalog_for_spellings(model: str, canonical: str) -> None:
    assert catalog_for(model).gpu_model == canonical
    assert is_mig_capable(model)


@pytest.mark.parametrize(
    "model",
    [
        "V100M32",
        "T4",
        "P100",
        "G2",
        "A10",
        "A30",
        "NVIDIA H100 NVL",
        "H100-94GB",
        "GH200",
        "H200-96GB",
        "A100",
        "",
        "A1000",
    ],
)
def test_catalog_for_unsupported(model: str) -> None:
    with pytest.raises(KeyError):
        catalog_for(model)
    with pytest.raises(ValueError, match=r"MIG catalog|A100"):
        catalog_for(model)
    with pytest.raises(UnsupportedGpuError):
        catalog_for(model)
    assert not is_mig_capable(model)


def test_unsupported_error_message_is_readable() -> None:
    with pytest.raises(UnsupportedGpuError) as info:
        catalog_for("T4")
    assert str(info.value).startswith("no MIG catalog for GPU model 'T4'")


def test_h100_mirrors_a100_80gb() -> None:
    h100, a100 = catalog_for("H100-80GB"), catalog_for("A100-80GB")
    for hp, ap in zip(h100, a100, strict=True):
        assert (hp.name, hp.compute_slices, hp.memory_slices, hp.max_instances, hp.starts) == (
            ap.name,
            ap.compute_slices,
            ap.memory_slices,
            ap.max_instances,
            ap.starts,
        )
    assert fill(h100, *["1g.10gb"] * 7).can_place("1g.10gb") is None
    assert fill(h100, "4g.40gb", "3g.40gb").to_config() == "4g.40gb:1,3g.40gb:1"


def test_h200_has_the_a100_placements_under_its_own_names() -> None:
    h200, a100 = catalog_for("H200"), catalog_for("A100-40GB")
    assert h200.names == ("7g.141gb", "4g.71gb", "3g.71gb", "2g.35gb", "1g.35gb", "1g.18gb", "1g.18gb+me")
    for hp, ap in zip(h200, a100, strict=True):
        assert (hp.compute_slices, hp.memory_slices, hp.max_instances, hp.starts) == (
            ap.compute_slices,
            ap.memory_slices,
            ap.max_instances,
            ap.starts,
        )
    assert h200.profile("1g.18gb").memory_mib == 16 * 1024  # nvidia-smi mig -lgip: 16.00 GiB
    balanced = h200.layout_from_counts({"3g.71gb": 1, "2g.35gb": 1, "1g.18gb": 2})
    assert [(inst.profile.name, inst.start) for inst in balanced] == [
        ("2g.35gb", 0),
        ("1g.18gb", 2),
        ("1g.18gb", 3),
        ("3g.71gb", 4),
    ]


def test_a100_80gb_names_scale_with_memory(a100_80: MigCatalog) -> None:
    assert a100_80.profile("1g.10gb").starts == tuple(range(7))
    assert a100_80.profile("1g.20gb").starts == (0, 2, 4, 6)
    assert a100_80.profile("7g.80gb").memory_slices == MEMORY_SLICES


# -- placement (the NVIDIA-documented rules) ----------------------------------------


def test_seven_1g_fit_and_an_eighth_does_not(a100_40: MigCatalog) -> None:
    layout = fill(a100_40, *["1g.5gb"] * 7)
    assert [inst.start for inst in layout] == list(range(7))
    assert layout.free_memory_slices == 1  # slot 7 is unusable by 1-slice profiles
    assert layout.can_place("1g.5gb") is None
    with pytest.raises(MigPlacementError, match=r"1g\.5gb allows at most 7"):
        layout.place("1g.5gb")


def test_two_3g_fit(a100_40: MigCatalog) -> None:
    layout = fill(a100_40, "3g.20gb", "3g.20gb")
    assert [(i.profile.name, i.start) for i in layout] == [("3g.20gb", 0), ("3g.20gb", 4)]
    assert layout.free_memory_slices == 0
    assert layout.free_compute_slices == 1
    assert layout.can_place("1g.5gb") is None


def test_4g_plus_3g_fit(a100_40: MigCatalog) -> None:
    layout = fill(a100_40, "4g.20gb", "3g.20gb")
    assert [(i.profile.name, i.start) for i in layout] == [("4g.20gb", 0), ("3g.20gb", 4)]
    assert layout.used_compute_slices == COMPUTE_SLICES


def test_4g_needs_slots_0_to_3(a100_40: MigCatalog) -> None:
    for taken in range(4):
        layout = a100_40.empty_layout().place("1g.5gb", taken)
        assert layout.can_place("4g.20gb") is None, taken
        with pytest.raises(MigPlacementError, match="overlaps"):
            layout.place("4g.20gb")
    # A 1g instance in the upper half leaves room for the 4g.
    layout = a100_40.empty_layout().place("1g.5gb", 4)
    assert layout.can_place("4g.20gb") == 0


def test_first_fit_1g_blocks_4g(a100_40: MigCatalog) -> None:
    layout = fill(a100_40, "1g.5gb")
    assert layout.instances == (PlacedInstance(a100_40.profile("1g.5gb"), 0),)
    assert layout.can_place("4g.20gb") is None
    assert layout.can_place("3g.20gb") == 4


def test_7g_only_alone(a100_40: MigCatalog) -> None:
    full = fill(a100_40, "7g.40gb")
    assert full.free_memory_slices == 0
    for name in a100_40.names:
        assert full.can_place(name) is None
    for name in a100_40.names:
        if name != "7g.40gb":
            assert fill(a100_40, name).can_place("7g.40gb") is None


def test_three_2g_then_a_1g_at_slot_6(a100_40: MigCatalog) -> None:
    layout = fill(a100_40, "2g.10gb", "2g.10gb", "2g.10gb")
    assert [i.start for i in layout] == [0, 2, 4]
    assert layout.can_place("1g.5gb") == 6
    layout = layout.place("1g.5gb")
    assert layout.used_compute_slices == COMPUTE_SLICES
    assert layout.to_config() == "2g.10gb:3,1g.5gb:1"


def test_1g_10gb_on_40gb_takes_two_slices(a100_40: MigCatalog) -> None:
    layout = fill(a100_40, *["1g.10gb"] * 4)
    assert [i.start for i in layout] == [0, 2, 4, 6]
    assert layout.free_memory_slices == 0
    assert layout.free_compute_slices == 3


def test_only_one_media_extension_instance(a100_40: MigCatalog) -> None:
    layout = fill(a100_40, "1g.5gb+me")
    assert layout.can_place("1g.5gb+me") is None
    with pytest.raises(MigPlacementError, match=r"\+me"):
        layout.place("1g.5gb+me")
    # Plain 1g instances still fit beside it.
    assert fill(a100_40, "1g.5gb+me", *["1g.5gb"] * 6).free_memory_slices == 1


def test_place_at_explicit_start(a100_40: MigCatalog) -> None:
    layout = a100_40.empty_layout().place("3g.20gb", 4)
    assert layout.instances[0].start == 4
    assert layout.can_place("3g.20gb") == 0
    with pytest.raises(MigPlacementError, match="cannot start at slot 2"):
        a100_40.empty_layout().place("3g.20gb", 2)
    with pytest.raises(MigPlacementError, match="overlaps"):
        layout.place_at("1g.5gb", 5)


def test_valid_starts(a100_40: MigCatalog) -> None:
    layout = a100_40.empty_layout().place("2g.10gb", 2)
    assert layout.valid_starts("2g.10gb") == (0, 4)
    assert layout.valid_starts("1g.5gb") == (0, 1, 4, 5, 6)
    assert layout.valid_starts("4g.20gb") == ()


def test_layouts_are_immutable_and_remove_frees(a100_40: MigCatalog) -> None:
    empty = a100_40.empty_layout()
    one = empty.place("4g.20gb")
    assert len(empty) == 0
    assert len(one) == 1
    assert one.remove(0) == empty
    with pytest.raises(MigPlacementError, match="no MIG instance starts at slot 3"):
        one.remove(3)
    two = one.place("3g.20gb")
    assert two.remove(0).can_place("4g.20gb") == 0
    assert hash(two) == hash(a100_40.empty_layout().place("3g.20gb", 4).place("4g.20gb"))


def test_occupancy_properties(a100_40: MigCatalog) -> None:
    layout = fill(a100_40, "3g.20gb", "1g.5gb")
    assert layout.used_slots == frozenset({0, 1, 2, 3, 4})
    assert layout.free_slots == (5, 6, 7)
    assert layout.free_memory_slices == 3
    assert layout.memory_mib == 19968 + 4864
    assert layout.counts() == {"3g.20gb": 1, "1g.5gb": 1}
    assert repr(layout) == "MigLayout('A100-40GB', [3g.20gb@0, 1g.5gb@4])"


def test_layout_constructor_validates(a100_40: MigCatalog, a100_80: MigCatalog) -> None:
    p3 = a100_40.profile("3g.20gb")
    ok = MigLayout(a100_40, (PlacedInstance(p3, 4), PlacedInstance(p3, 0)))
    assert [i.start for i in ok] == [0, 4]
    with pytest.raises(MigPlacementError, match="overlaps"):
        MigLayout(a100_40, (PlacedInstance(p3, 0), PlacedInstance(a100_40.profile("1g.5gb"), 2)))
    with pytest.raises(MigPlacementError, match="not a MIG profile of A100-40GB"):
        MigLayout(a100_40, (PlacedInstance(a100_80.profile("3g.40gb"), 0),))
    with pytest.raises(MigPlacementError, match="not a MIG profile of A100-80GB"):
        a100_80.empty_layout().place(p3)


def test_layout_from_counts_searches_all_placements(a100_40: MigCatalog) -> None:
    # First fit from slot 0 would put the 3g at 0 and strand a 1g; the search puts it at 4.
    layout = a100_40.layout_from_counts({"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2})
    assert layout.counts() == {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}
    assert layout.used_compute_slices == COMPUTE_SLICES
    assert a100_40.layout_from_counts({}) == a100_40.empty_layout()
    with pytest.raises(MigPlacementError, match=r"no MIG layout holds 1g\.5gb:7,2g\.10gb:3"):
        a100_40.layout_from_counts(parse_mig_config("1g.5gb:7,2g.10gb:3"))
    with pytest.raises(ValueError, match="negative"):
        a100_40.layout_from_counts({"1g.5gb": -1})
    with pytest.raises(KeyError):
        a100_40.layout_from_counts({"3g.40gb": 1})


def _all_layouts(catalog: MigCatalog) -> set[MigLayout]:
    """Every reachable layout, by exhaustive placement at every valid start."""
    seen: set[MigLayout] = set()
    frontier = [catalog.empty_layout()]
    while frontier:
        layout = frontier.pop()
        if layout in seen:
            continue
        seen.add(layout)
        for profile in catalog:
            for start in layout.valid_starts(profile):
                frontier.append(layout.place(profile, start))
    return seen


@pytest.mark.parametrize("model", ["A100-40GB", "A100-80GB", "H100-80GB", "H200"])
def test_every_reachable_layout_is_consistent(model: str) -> None:
    catalog = catalog_for(model)
    layouts = _all_layouts(catalog)
    assert len(layouts) > 100
    for layout in layouts:
        slots = [s for inst in layout for s in inst.slots]
        assert len(slots) == len(set(slots))  # no overlap
        assert max(slots, default=0) < MEMORY_SLICES
        assert layout.used_compute_slices <= COMPUTE_SLICES
        assert sum(inst.profile.media_extensions for inst in layout) <= 1
        for name, count in layout.counts().items():
            assert count <= catalog.profile(name).max_instances
        # layout_from_counts finds a layout for every reachable multiset.
        assert catalog.layout_from_counts(layout.counts()).counts() == layout.counts()


@given(
    names=st.lists(st.sampled_from(catalog_for("A100-40GB").names), max_size=12),
)
def test_place_matches_can_place(names: list[str]) -> None:
    catalog = catalog_for("A100-40GB")
    layout = catalog.empty_layout()
    for name in names:
        start = layout.can_place(name)
        if start is None:
            with pytest.raises(MigPlacementError):
                layout.place(name)
        else:
            placed = layout.place(name)
            assert PlacedInstance(catalog.profile(name), start) in placed.instances
            assert placed.remove(start) == layout
            layout = placed


def test_profile_validation() -> None:
    with pytest.raises(ValueError, match="invalid MIG profile name"):
        MigProfile("one-g", 1, 1, 4864, 7, (0,))
    with pytest.raises(ValueError, match="exceed"):
        MigProfile("2g.10gb", 2, 2, 9856, 3, (0, 7))
    with pytest.raises(ValueError, match="ascending"):
        MigProfile("2g.10gb", 2, 2, 9856, 3, (2, 0))
    with pytest.raises(ValueError, match=r"\+me"):
        MigProfile("1g.5gb", 1, 1, 4864, 1, (0,), media_extensions=True)


# -- names and configuration strings ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("1g.5gb", True),
        ("1g.5gb+me", True),
        ("7g.80gb", True),
        ("3g.40gb", True),
        ("1g.5gb.me", False),  # resource-safe spelling, not canonical
        ("MIG 1g.5gb", False),
        ("1G.5GB", False),
        ("0g.5gb", False),
        ("1g5gb", False),
        ("", False),
        ("1g.5gb+", False),
    ],
)
def test_is_valid_profile_name(name: str, valid: bool) -> None:
    assert is_valid_profile_name(name) is valid


def test_is_valid_profile_name_for_a_model() -> None:
    assert is_valid_profile_name("1g.5gb", "A100-40GB")
    assert not is_valid_profile_name("1g.5gb", "A100-80GB")
    assert is_valid_profile_name("1g.10gb+me", "H100-80GB")
    assert not is_valid_profile_name("1g.5gb", "T4")


def test_normalize_profile_name() -> None:
    assert normalize_profile_name(" MIG 1g.5gb ") == "1g.5gb"
    assert normalize_profile_name("1G.10GB.ME") == "1g.10gb+me"
    assert normalize_profile_name("nvidia.com/mig-3g.20gb") == "3g.20gb"


def test_parse_mig_config_seed_label() -> None:
    assert parse_mig_config("1g.5gb:7,2g.10gb:3") == {"1g.5gb": 7, "2g.10gb": 3}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("  ", {}),
        ("3g.20gb:2", {"3g.20gb": 2}),
        ("1g.5gb = 2 , 1g.5gb:1", {"1g.5gb": 3}),
        ("1g.5gb-7_2g.10gb-3", {"1g.5gb": 7, "2g.10gb": 3}),
        ("1g.5gb.me-1_1g.5gb-6", {"1g.5gb+me": 1, "1g.5gb": 6}),
        ("1g.5gb+me:1", {"1g.5gb+me": 1}),
        ("4g.20gb:0", {"4g.20gb": 0}),
    ],
)
def test_parse_mig_config(text: str, expected: dict[str, int]) -> None:
    assert parse_mig_config(text) == expected


@pytest.mark.parametrize(
    "text",
    ["1g.5gb", "1g.5gb:", ":3", "1g.5gb:x", "1g.5gb:7,,2g.10gb:3", "foo:1", "1g.5gb:-1", "1g.5gb:1:2"],
)
def test_parse_mig_config_invalid(text: str) -> None:
    with pytest.raises(MigConfigError):
        parse_mig_config(text)


def test_parse_mig_config_against_catalog(a100_40: MigCatalog) -> None:
    assert parse_mig_config("1g.5gb:7", a100_40) == {"1g.5gb": 7}
    with pytest.raises(MigConfigError, match=r"A100-40GB has no MIG profile '1g\.20gb'"):
        parse_mig_config("1g.20gb:1", a100_40)


def test_format_mig_config_round_trip() -> None:
    counts = {"1g.5gb+me": 1, "1g.5gb": 6, "2g.10gb": 0}
    human = format_mig_config(counts)
    safe = format_mig_config(counts, label_safe=True)
    assert human == "1g.5gb+me:1,1g.5gb:6"
    assert safe == "1g.5gb.me-1_1g.5gb-6"
    expected = {"1g.5gb+me": 1, "1g.5gb": 6}
    assert parse_mig_config(human) == parse_mig_config(safe) == expected
    assert format_mig_config([("3g.20gb", 2)]) == "3g.20gb:2"
    with pytest.raises(ValueError, match="negative"):
        format_mig_config({"1g.5gb": -1})


def test_label_safe_form_is_a_valid_label_value() -> None:
    import re

    label_value = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
    for catalog in catalogs():
        for combo in itertools.combinations(catalog.names, 3):
            text = format_mig_config(dict.fromkeys(combo, 1), label_safe=True)
            assert label_value.fullmatch(text), text
            assert len(text) <= 63
