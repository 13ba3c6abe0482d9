"""The plan of gear image copies box to box (module_utils/image_copy.py, image_copy_plan)."""

from __future__ import annotations

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils import image_copy
from ansible_collections.lobes.fleet.plugins.modules import (
    image_copy_plan,
    image_export,
    image_pull,
)
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.modules import run_module

PINNED = "registry.example/lobes/vllm@sha256:" + "1a" * 32
OTHER = "registry.example/lobes/audio@sha256:" + "2b" * 32


def image(host: str, ref: str, copies: bool) -> dict:
    return {"host": host, "role": "cortex", "run": ref, "copy": ref if copies else ""}


def boxes(*hosts: str) -> dict:
    return {host: {"origin": f"http://{host}.tailnet.example:8080"} for host in hosts}


def test_boxes_that_copy_are_filled_from_the_holders_in_doubling_rounds():
    images = [image("a", PINNED, False)] + [image(f"c{n}", PINNED, True) for n in range(5)]
    pulls, rounds, errors = image_copy.copy_pulls(images, {"a": [PINNED]}, boxes("a"))
    assert errors == [] and rounds == 3  # 1 -> 2 -> 4 -> 6 boxes
    assert pulls["c0"] == [{"round": 0, "ref": PINNED, "source": "a",
                            "address": "a.tailnet.example"}]
    sources = {host: entry[0]["source"] for host, entry in pulls.items()}
    assert sources == {"c0": "a", "c1": "a", "c2": "c0", "c3": "a", "c4": "c0"}
    assert "a" not in pulls  # a box that pulls from the registry copies nothing


def test_a_box_that_holds_the_tar_already_is_a_source_and_copies_nothing():
    images = [image("c0", PINNED, True), image("c1", PINNED, True)]
    pulls, rounds, errors = image_copy.copy_pulls(images, {"c0": [PINNED]}, {})
    assert (pulls, rounds, errors) == ({"c1": [{"round": 0, "ref": PINNED, "source": "c0",
                                                "address": "c0"}]}, 1, [])
    assert image_copy.copy_pulls(images, {"c0": [PINNED], "c1": [PINNED]}, {}) == ({}, 0, [])


def test_an_image_no_box_holds_is_refused_naming_it_the_boxes_and_the_fix():
    images = [image("c0", PINNED, True), image("c1", OTHER, True), image("a", OTHER, False)]
    pulls, _rounds, errors = image_copy.copy_pulls(images, {"a": [OTHER]}, {})
    assert errors == [f"{PINNED}: no box holds it to copy to host c0 (fleet_images_from: boxes); "
                      "let one box that runs it pull it (fleet_images_from: registry), or pull "
                      "it by hand on one of them"]
    assert pulls == {"c1": [{"round": 0, "ref": OTHER, "source": "a", "address": "a"}]}


@given(st.integers(1, 4), st.integers(0, 20))
def test_every_box_that_copies_gets_the_image_once_from_a_box_that_held_it_before(holders, needers):
    images = ([image(f"h{n}", PINNED, False) for n in range(holders)]
              + [image(f"n{n}", PINNED, True) for n in range(needers)])
    held = {f"h{n}": [PINNED] for n in range(holders)}
    pulls, rounds, errors = image_copy.copy_pulls(images, held, {})
    assert errors == [] and sorted(pulls) == sorted(f"n{n}" for n in range(needers))
    holding = {f"h{n}": -1 for n in range(holders)}
    for number in range(rounds):
        sending = []
        for host, [pull] in sorted(pulls.items()):
            if pull["round"] == number:
                assert holding[pull["source"]] < number  # it held the image before the round
                sending.append(pull["source"])
                holding[host] = number
        assert len(sending) == len(set(sending))  # a box sends to one box a round


def test_image_copy_plan_fails_naming_the_image_no_box_holds():
    result = run_module(image_copy_plan.main, {"plan": {"boxes": {}},
                                               "images": [image("c0", PINNED, True)]})
    assert result["failed"] is True and PINNED in result["msg"] and "c0" in result["msg"]


@pytest.mark.parametrize("main", [image_export.main, image_pull.main])
def test_the_image_modules_refuse_a_reference_not_pinned_by_digest_before_running_docker(main):
    args = {"refs": ["registry.example/lobes/vllm:v1"]} if main is image_export.main else {
        "ref": "registry.example/lobes/vllm:v1", "source": "a"}
    result = run_module(main, args)
    assert result["failed"] is True and "names no digest" in result["msg"], result
