"""README.md stays true: its Python examples run, and CI runs its test block."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import ember

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_what_you_can_do_example_runs():
    block = README.split("## What you can do with it", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if "(fn" not in line]  # those need a user function
    namespace = {"torch": torch, "ember": ember}
    exec("\n".join(lines), namespace)
    assert namespace["report"].kernels[0].name == "fused_relu_mul_add_0"
    assert namespace["report"].fallbacks == []


def test_ci_runs_the_readme_test_block():
    block = re.search(r"<!-- ci:test -->\n```bash\n(.*?)```", README, re.S)
    assert block and "pytest" in block.group(1)
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "ci:test" in ci


def test_ragged_example_runs():
    block = README.split("### Ragged batches", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    from ember.workloads.giou import make_batch, padded_giou_loss

    pred, boxes, padded = make_batch(16)
    namespace = {"torch": torch, "ember": ember, "boxes_per_image": boxes}
    exec(block, namespace)
    torch.testing.assert_close(namespace["fast"](pred, namespace["targets"]), padded_giou_loss(pred, padded))


def test_the_settings_table_lists_every_variable_ember_reads():
    # (EMBER_CPU_EMBEDDING_BAG was read by ember/config.py but missing from the table)
    config_source = (Path(ember.__file__).parent / "config.py").read_text()
    read = set(re.findall(r"""_env_\w+\(\s*["'](EMBER_\w+)["']|environ\.get\(\s*["'](EMBER_\w+)["']""", config_source))
    read = {a or b for a, b in read}
    table = README[README.index("## Settings"):]
    table = table[:table.index("\n\n", table.index("| variable"))]
    listed = set(re.findall(r"^\| `(EMBER_\w+)` \|", table, re.M))
    assert len(read) > 10 and read <= listed, sorted(read - listed)
