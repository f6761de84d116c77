"""`spotwise estimate TASK.yaml` for a built-in llama prices the FLOPs of the model that will run:
6 x (parameters - input embedding) + 12 x layers x dim x seq per token, against a hand count."""

from __future__ import annotations

import json

import pytest

from spotwise.cli import main
from spotwise.pricing.estimate import gpu_peaks

# Hand counts: (flavor, dim, layers, kv width, ffn, vocab, seq). Per block: wq+wo 2·d², wk+wv 2·d·kv,
# SwiGLU 3·d·ffn, two norms 2·d; plus untied embedding and head 2·V·d and the final norm d.
SHAPES = {"8b": (4096, 32, 8 * 128, 14336, 128256, 8192), "1b": (2048, 16, 8 * 64, 8192, 32000, 2048),
          "debug": (128, 2, 2 * 32, 384, 256, 128)}


def hand_count(flavor: str) -> tuple[int, float]:
    d, L, kv, ffn, V, seq = SHAPES[flavor]
    n = L * (2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d) + 2 * V * d + d
    return n, 6 * (n - V * d) + 12 * L * d * seq


def test_hand_count_is_llama_3_8b():
    assert hand_count("8b")[0] == 8_030_261_248          # Meta's published 8.03B


@pytest.mark.parametrize("flavor, steps", [("8b", 1000), ("1b", 1000), ("debug", 1_000_000_000)])
def test_estimate_prices_the_flavors_flops(capsys, tmp_path, flavor, steps):
    batch = 64      # the rows round hours to 4 decimals: every job here runs for more than half an hour
    task = tmp_path / "t.yaml"
    task.write_text(f"name: t\nresources:\n  accelerators: {{H100: 8}}\n  nodes: 1\ntraining:\n  entrypoint: llama\n"
                    f"  model: {{flavor: {flavor}}}\n  steps: {steps}\n  batch_size: {batch}\n")
    assert main(["estimate", str(task), "--mfu", "0.4", "--format", "json", "--market", "on-demand"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows
    n, per_token = hand_count(flavor)
    tokens = steps * batch * SHAPES[flavor][5]
    peak = gpu_peaks()["H100"][0] * 1e12
    for r in rows:
        flops = r["compute_hours"] * 3600 * r["nodes"] * r["accelerator_count"] * peak * 0.4
        assert flops == pytest.approx(per_token * tokens, rel=0.01)
        # and not the bare 6·N·T the estimator uses for a model it does not know
        assert abs(flops / (6 * n * tokens) - 1) > 0.02


def test_tiny_gpt_is_still_priced_at_6_n_t(capsys, tmp_path):
    task = tmp_path / "t.yaml"
    task.write_text("name: t\nresources:\n  accelerators: {H100: 8}\n  nodes: 1\ntraining:\n"
                    "  model: {d_model: 256, n_layers: 4, n_heads: 4, seq_len: 128}\n  steps: 10000000\n  batch_size: 64\n")
    assert main(["estimate", str(task), "--mfu", "0.4", "--format", "json", "--market", "on-demand"]) == 0
    r = json.loads(capsys.readouterr().out)[0]
    n = 12 * 4 * 256 ** 2 + 256 * 256 + 128 * 256
    flops = r["compute_hours"] * 3600 * 8 * gpu_peaks()["H100"][0] * 1e12 * 0.4
    assert flops == pytest.approx(6 * n * 10_000_000 * 64 * 128, rel=1e-3)     # hours rounded to 4 decimals


@pytest.mark.parametrize("model, field", [
    ("{flavor: 3b}", "training.model.flavor"),
    ("{flavor: debug, n_kv_heads: 3}", "training.model"),
    ("{flavor: debug, d_model: 64}", "training.model.d_model"),
])
def test_bad_llama_section_exits_2_naming_the_field(capsys, tmp_path, model, field):
    task = tmp_path / "t.yaml"
    task.write_text(f"name: t\nresources:\n  accelerators: {{H100: 8}}\ntraining:\n  entrypoint: llama\n"
                    f"  model: {model}\n")
    assert main(["estimate", str(task), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_the_llama_example_is_a_plan(capsys, tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    example = Path(__file__).parents[2] / "examples" / "llama-debug.yaml"
    assert main(["launch", str(example), "--dry-run", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["chosen"]["cloud"] == "local"


def test_a_batch_that_does_not_split_over_ranks_and_micro_batches_exits_2(capsys, tmp_path):
    task = tmp_path / "t.yaml"
    task.write_text("name: t\nresources:\n  accelerators: {H100: 8}\n  nodes: 2\ntraining:\n  entrypoint: llama\n"
                    "  model: {flavor: debug}\n  batch_size: 12\n  grad_accum: 4\n")
    assert main(["estimate", str(task), "--format", "json"]) == 2
    err = capsys.readouterr().err
    # 2 nodes x 8 GPUs x 4 micro-batches: the world size, not the node count (issue 49)
    assert "training.batch_size" in err and "world sizes 16 (2 node(s) x 8), so a multiple of 64" in err
    assert "Traceback" not in err
    task.write_text(task.read_text().replace("batch_size: 12", "batch_size: 64"))
    assert main(["estimate", str(task), "--format", "json"]) == 0
