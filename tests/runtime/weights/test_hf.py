"""Weights in the Hugging Face Llama layout: config.json as the architecture, the q/k permutation,
loading per tensor after sharding, checked against ``transformers`` itself.

The yardstick is a random ``transformers.LlamaForCausalLM`` made in the test from a
``LlamaConfig`` (no download), saved with ``save_pretrained``: after ``init_from``, spotwise's
eval loss over a token file must equal transformers' loss on the same windows (fp32, 1e-4)."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from spotwise.runtime.config import TrainConfig
from spotwise.runtime.weights.load import HFWeights, hf_to_meta, meta_to_hf
from spotwise.runtime.weights.config import (HFConfigError, merge_init_from, resolve_training,
                                               section_from_hf)
from spotwise.runtime.training.builtin import llama_spec
from spotwise.runtime.training.evaluate import eval_loss, n_windows
from spotwise.runtime.training.parallel import parallelize

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")

# (tied, GQA, llama3 scaling, older config spelling)
SHAPES = {
    "tied-gqa-llama3": dict(tie=True, kv=2, scaling=True, old=False),
    "untied-mha-old-config": dict(tie=False, kv=4, scaling=False, old=True),
    "untied-gqa-llama3-old-config": dict(tie=False, kv=1, scaling=True, old=True),
}


def hf_model(tmp_path, *, tie, kv, scaling, old, vocab=300, shard="60KB"):
    """A random HF Llama saved at ``tmp_path / "hf"`` (sharded), and the model itself (fp32)."""
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    if scaling:     # original_max_position_embeddings small, so all three bands of the scaling occur
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=kv, tie_word_embeddings=tie,
                                   rms_norm_eps=1e-5, max_position_embeddings=256, rope_parameters=rope)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):       # away from 1, so a misplaced norm shows
                p.uniform_(0.5, 1.5)
            elif n.endswith(("q_proj.weight", "k_proj.weight")):
                p.normal_(0.0, 0.5)             # sharp attention: the scores (and so RoPE's layout) matter
            else:
                p.normal_(0.0, 0.1)
    d = tmp_path / "hf"
    model.save_pretrained(d, max_shard_size=shard)
    if old:         # Meta's published spelling: rope_theta and rope_scaling at the top level
        c = json.loads((d / "config.json").read_text())
        params = c.pop("rope_parameters")
        c["rope_theta"] = params.pop("rope_theta")
        c["rope_scaling"] = params if params["rope_type"] != "default" else None
        (d / "config.json").write_text(json.dumps(c))
    return d, model


def hf_loss(model, tokens, seq_len):
    """transformers' mean next-token loss over the module docstring's windows of ``tokens``."""
    n = n_windows(len(tokens), seq_len)
    rows = torch.stack([torch.from_numpy(tokens[i * seq_len:(i + 1) * seq_len + 1].astype(np.int64))
                        for i in range(n)])
    with torch.no_grad():
        logits = model(rows[:, :-1]).logits
    return F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten()).item()


def spotwise_model(d, **training):
    raw = resolve_training({"entrypoint": "llama", "init_from": f"file://{d}", **training})
    cfg = TrainConfig.model_validate(raw)
    return cfg, parallelize(llama_spec(cfg).model_fn(), device=CPU, precision="fp32")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_init_from_gives_transformers_loss(pg1, tmp_path, monkeypatch, shape):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    d, ref = hf_model(tmp_path, **SHAPES[shape])
    assert len(list(d.glob("*.safetensors"))) > 1            # sharded, with its index
    cfg, model = spotwise_model(d, model={"seq_len": 48})
    assert (cfg.llama.tie_embeddings, cfg.llama.n_kv_heads) == (SHAPES[shape]["tie"], SHAPES[shape]["kv"])
    tokens = np.random.default_rng(1).integers(0, 300, size=48 * 5 + 7).astype(np.uint16)
    ours = eval_loss(model, tokens, 48, device=CPU, batch=2)
    assert ours == pytest.approx(hf_loss(ref, tokens, 48), abs=1e-4)
    assert ours > 1.0     # a real loss (random weights over 300 ids: about ln 300 = 5.7)


def test_single_file_layout_loads(pg1, tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    d, ref = hf_model(tmp_path, tie=False, kv=2, scaling=False, old=False, shard="10GB")
    assert (d / "model.safetensors").is_file() and not (d / "model.safetensors.index.json").exists()
    _, model = spotwise_model(d, model={"seq_len": 32})
    tokens = np.random.default_rng(2).integers(0, 300, size=100).astype(np.uint16)
    assert eval_loss(model, tokens, 32, device=CPU) == pytest.approx(hf_loss(ref, tokens, 32), abs=1e-4)


def test_the_permutation_is_the_rotate_half_one_and_inverts():
    """Row ``2i`` of a head (interleaved) is row ``i`` of the rotate-half layout, ``2i+1`` row
    ``i + head_dim/2``: the rows' order the HF conversion script produced from Meta's."""
    heads, hd, cols = 3, 8, 5
    meta = torch.arange(heads * hd * cols, dtype=torch.float32).reshape(heads * hd, cols)
    hf = meta_to_hf(meta, heads)
    for h in range(heads):
        for i in range(hd // 2):
            assert torch.equal(hf[h * hd + i], meta[h * hd + 2 * i])
            assert torch.equal(hf[h * hd + hd // 2 + i], meta[h * hd + 2 * i + 1])
    assert torch.equal(hf_to_meta(hf, heads), meta)


def test_a_rank_reads_only_its_rows_and_they_are_the_whole_tensors_rows(tmp_path):
    """``HFWeights.rows`` for every rank's shard at 1, 3 and 8 ranks (uneven splits that cut a head
    of wq/wk in the middle, and empty last shards) equals the same rows of the whole tensor read
    and permuted: what a rank fills after sharding is its slice of the file's tensor."""
    d, _ = hf_model(tmp_path, tie=False, kv=2, scaling=False, old=False)
    w = HFWeights(d, n_heads=4, n_kv_heads=2)
    for name in ("blocks.0.attention.wq.weight", "blocks.1.attention.wk.weight", "blocks.0.attention.wv.weight",
                 "tok_embeddings.weight", "blocks.0.ffn_norm.weight", "output.weight"):
        whole = w.read(name)
        for world in (1, 3, 8):
            per = -(-whole.shape[0] // world)
            for rank in range(world):
                start = min(rank * per, whole.shape[0])
                out = torch.full((max(0, min(per, whole.shape[0] - start)), *whole.shape[1:]), float("nan"))
                w.rows(name, out, start, list(whole.shape))
                assert torch.equal(out, whole[start:start + out.shape[0]]), (name, world, rank)
    with pytest.raises(ValueError, match=r"has shape \[64, 64\], the model's blocks.0.attention.wq.weight \[32, 64\]"):
        w.rows("blocks.0.attention.wq.weight", torch.empty(4, 64), 0, [32, 64])


def test_a_task_naming_a_conflicting_flavor_or_dimension_is_refused_naming_both(tmp_path):
    d, _ = hf_model(tmp_path, tie=True, kv=2, scaling=True, old=False)
    with pytest.raises(HFConfigError) as e:
        resolve_training({"init_from": f"file://{d}", "model": {"flavor": "debug"}})
    assert "flavor 'debug' sets dim 128" in str(e.value) and "config.json hidden_size 64" in str(e.value)
    with pytest.raises(HFConfigError) as e:
        resolve_training({"init_from": f"file://{d}", "model": {"n_kv_heads": 4}})
    assert "n_kv_heads 4" in str(e.value) and "num_key_value_heads 2" in str(e.value)
    same = resolve_training({"init_from": f"file://{d}", "model": {"dim": 64, "seq_len": 16}})
    assert same["model"]["dim"] == 64 and same["model"]["seq_len"] == 16 and same["model"]["tie_embeddings"]


def test_published_configs_are_the_published_flavors():
    """Meta's config.json of Llama 3.2 1B and 3.1 8B (the values of meta-llama/Llama-3.2-1B and
    Llama-3.1-8B on the Hugging Face hub, written here) resolve to the flavors, with no conflict."""
    common = dict(model_type="llama", hidden_act="silu", attention_bias=False, mlp_bias=False, rms_norm_eps=1e-5,
                  rope_theta=500000.0, vocab_size=128256, num_key_value_heads=8, num_attention_heads=32,
                  max_position_embeddings=131072)
    one = dict(common, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
               tie_word_embeddings=True, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0,
                                                       "original_max_position_embeddings": 8192})
    eight = dict(common, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, tie_word_embeddings=False,
                 rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    from spotwise.runtime.llama_config import LlamaConfig

    for flavor, cfg in (("llama3.2-1b", one), ("llama3.1-8b", eight)):
        merged = merge_init_from({"flavor": flavor}, section_from_hf(cfg), max_positions=131072)
        assert LlamaConfig.model_validate(merged) == LlamaConfig(flavor=flavor)     # seq_len the flavor's, 8192


@pytest.mark.parametrize("change, says", [
    ({"model_type": "mistral"}, "model_type 'mistral'"),
    ({"attention_bias": True}, "attention_bias true"),
    ({"head_dim": 32}, "head_dim 32"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope_type 'yarn'"),
])
def test_configs_the_built_in_llama_is_not_are_refused(change, says):
    base = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=160, vocab_size=300)
    with pytest.raises(HFConfigError, match=says):
        section_from_hf({**base, **change})


def test_a_shape_or_dtype_mismatch_names_the_tensor(tmp_path):
    from safetensors.torch import save_file

    d = tmp_path / "w"
    d.mkdir()
    save_file({"model.layers.0.self_attn.v_proj.weight": torch.zeros(32, 64),
               "model.norm.weight": torch.zeros(64, dtype=torch.int32)}, d / "model.safetensors")
    w = HFWeights(d, n_heads=4, n_kv_heads=2)
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.v_proj.weight has shape \[32, 64\]"):
        w("blocks.0.attention.wv.weight", torch.empty(16, 64))
    with pytest.raises(ValueError, match="model.norm.weight has dtype torch.int32"):
        w("norm.weight", torch.empty(64))
    with pytest.raises(ValueError, match="no tensor model.embed_tokens.weight"):
        w("tok_embeddings.weight", torch.empty(300, 64))


def test_a_preempted_init_from_run_resumes_bitwise_and_never_reads_init_from_again(pg1, tmp_path, monkeypatch):
    """Preempted at step 3 of 6 (the just-in-time checkpoint), resumed with the init_from directory
    gone: the weights of the run never interrupted, bit for bit (the resumed run loads its own
    checkpoint; reading init_from again would fail here)."""
    import shutil

    from spotwise.runtime.checkpoint.checkpointer import run_storage
    from spotwise.runtime.config import CheckpointConfig
    from spotwise.runtime.training.loop import LocalSession, run_loop

    class PreemptAt3(LocalSession):
        def report_progress(self, step, loss, perf=None):
            self.preempted = step == 3

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    d, _ = hf_model(tmp_path, tie=True, kv=2, scaling=True, old=False)
    raw = resolve_training({"entrypoint": "llama", "init_from": f"file://{d}", "model": {"seq_len": 32}, "steps": 6,
                            "batch_size": 2, "lr": 1e-3, "precision": "fp32"})
    cfg = TrainConfig.model_validate({**raw, "checkpoint": CheckpointConfig(interval_steps=100)})
    ref = run_loop(llama_spec(cfg), LocalSession(), run_storage(f"file://{tmp_path}", "ref"))
    st = run_storage(f"file://{tmp_path}", "run")
    part = run_loop(llama_spec(cfg, agree_interval_s=0), PreemptAt3(), st)
    assert part.preempted and part.steps_completed == 3
    shutil.rmtree(d)
    shutil.rmtree(tmp_path / "home")          # the node's cache too: nothing of init_from is left
    s = LocalSession()
    full = run_loop(llama_spec(cfg), s, st)
    assert s.resumes == [(3, 1)]
    assert full.model_sha256 == ref.model_sha256 and full.losses == ref.losses[3:]
    with pytest.raises(Exception, match="config.json"):      # a fresh run does need the directory
        run_loop(llama_spec(cfg), LocalSession(), run_storage(f"file://{tmp_path}", "fresh"))


def test_a_task_file_with_init_from_carries_the_files_architecture_or_exits_2(tmp_path):
    from spotwise.errors import InputError
    from spotwise.taskspec import load_taskspec

    d, _ = hf_model(tmp_path, tie=True, kv=2, scaling=True, old=True)
    task = tmp_path / "t.yaml"
    task.write_text(f"name: ft\ntraining:\n  entrypoint: llama\n  init_from: file://{d}\n  model: {{seq_len: 64}}\n")
    m = load_taskspec(task).training.llama
    assert (m.dim, m.n_kv_heads, m.vocab_size, m.tie_embeddings, m.seq_len) == (64, 2, 300, True, 64)
    assert m.rope_scaling is not None and m.rope_scaling.factor == 8.0
    task.write_text(f"name: ft\ntraining:\n  entrypoint: llama\n  init_from: file://{d}\n  model: {{flavor: 1b}}\n")
    with pytest.raises(InputError) as e:
        load_taskspec(task)
    assert e.value.exit_code == 2
    p = e.value.problems[0]
    assert p.field == "training.init_from" and "flavor '1b' sets dim 2048" in p.allowed and "hidden_size 64" in p.allowed
    task.write_text(f"name: ft\ntraining:\n  entrypoint: llama\n  init_from: file://{tmp_path}/none\n")
    with pytest.raises(InputError, match="no config.json"):
        load_taskspec(task)


def write_tokens(path, ids, vocab):
    from spotwise.runtime.data.tokens import TokenWriter, write_meta

    path.parent.mkdir(parents=True, exist_ok=True)
    w = TokenWriter(path, vocab)
    w.write(ids)
    write_meta(path.parent / "meta.json", tokens_file=path.name, vocab_size=vocab, written=w.close(),
               tokenizer={"kind": "bytes"}, eod_id=None, inputs=[], documents=1, created_at="2026-12-06T00:00:00Z")
    return f"file://{path}"


def test_the_loop_measures_the_held_out_loss_at_0_every_n_and_the_last_step(pg1, tmp_path, monkeypatch):
    """training.eval through the loop: step 0's value (before any update) is transformers' loss
    on the eval file's windows; then every 2 steps and at the last (5)."""
    from spotwise.runtime.checkpoint.checkpointer import run_storage
    from spotwise.runtime.training.loop import LocalSession, run_loop

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    d, ref = hf_model(tmp_path, tie=True, kv=2, scaling=True, old=False)
    tokens = np.random.default_rng(3).integers(0, 300, size=32 * 6 + 3)
    uri = write_tokens(tmp_path / "eval" / "tokens.bin", tokens, 300)
    raw = resolve_training({"entrypoint": "llama", "init_from": f"file://{d}", "model": {"seq_len": 32}, "steps": 5,
                            "batch_size": 2, "lr": 1e-3, "precision": "fp32",
                            "eval": {"data": uri, "every_steps": 2}})
    s = LocalSession()
    out = run_loop(llama_spec(TrainConfig.model_validate(raw)), s, run_storage(f"file://{tmp_path}", "ev"))
    assert [e["step"] for e in out.eval_loss] == [0, 2, 4, 5] == [st for st, _ in s.evals]
    assert out.eval_loss[0]["loss"] == pytest.approx(hf_loss(ref, tokens.astype(np.uint16), 32), abs=1e-4)
    assert out.eval_loss[-1]["loss"] != out.eval_loss[0]["loss"]       # training moved the weights
    # beside each later one, the step's training loss over all ranks (one rank here: its own)
    assert out.eval_loss[0]["train_loss"] is None
    assert [e["train_loss"] for e in out.eval_loss[1:]] == [out.losses[1], out.losses[3], out.losses[4]]


def test_eval_windows_cover_every_target_once():
    """Windows of seq_len + 1 stepped by seq_len: 10 tokens at seq_len 3 give windows 0..2 (tokens
    0-3, 3-6, 6-9), every token but the first a target once; one more token adds no window."""
    from spotwise.runtime.training.evaluate import window_batch

    toks = np.arange(10)
    assert n_windows(10, 3) == 3 and n_windows(11, 3) == 3 and n_windows(3, 3) == 0
    x, y = window_batch(toks, np.arange(3), 3)
    assert y.flatten().tolist() == list(range(1, 10)) and x[:, 0].tolist() == [0, 3, 6]


@pytest.mark.parametrize("tie, shard", [(True, 40_000), (False, 10**9)])
def test_an_export_after_training_loads_in_transformers_with_spotwises_logits(pg1, tmp_path, monkeypatch, tie, shard):
    """init_from, 3 training steps, export of the newest checkpoint (fp32; sharded, then one file):
    transformers loads it and its logits equal spotwise's on the same input to 1e-4."""
    from spotwise.runtime.checkpoint.checkpointer import Checkpointer, run_storage
    from spotwise.runtime.weights.export import export_run
    from spotwise.runtime.storage.base import open_storage
    from spotwise.runtime.training.loop import LocalSession, _restore, run_loop

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    d, before = hf_model(tmp_path, tie=tie, kv=2, scaling=True, old=False)
    raw = resolve_training({"entrypoint": "llama", "init_from": f"file://{d}", "model": {"seq_len": 32}, "steps": 3,
                            "batch_size": 2, "lr": 1e-2, "precision": "fp32"})
    cfg = TrainConfig.model_validate(raw)
    st = run_storage(f"file://{tmp_path}", "run")
    run_loop(llama_spec(cfg), LocalSession(), st)
    spec = llama_spec(cfg)
    model = parallelize(spec.model_fn(), device=CPU, precision="fp32")
    assert _restore(Checkpointer(st), model, spec.optimizer_fn(model.parameters())).step == 3
    out = tmp_path / "export"
    got = export_run(st, cfg.llama, open_storage(f"file://{out}"), dtype="fp32", shard_bytes=shard)
    assert got["step"] == 3 and (len(got["files"]) > 3) == (shard < 10**6)
    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    x = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours, theirs, old = model(x), hf(x).logits, before(x).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    assert (theirs - old).abs().max().item() > 1e-3           # the export is the trained weights, not the start
    assert hf.config.tie_word_embeddings == tie
    # the export as a later run's init_from: every file checked against the sha256.json it wrote
    from spotwise.runtime.weights.cache import fetch_model

    assert set(json.loads((out / "sha256.json").read_text())) == set(got["files"]) - {"sha256.json"}
    assert (fetch_model(f"file://{out}", root=tmp_path / "cache") / "config.json").is_file()


def test_export_writes_bf16_by_default(pg1, tmp_path, monkeypatch):
    from safetensors import safe_open

    from spotwise.runtime.checkpoint.checkpointer import run_storage
    from spotwise.runtime.weights.export import export_run
    from spotwise.runtime.storage.base import open_storage
    from spotwise.runtime.training.loop import LocalSession, run_loop

    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path / "home"))
    d, _ = hf_model(tmp_path, tie=True, kv=2, scaling=False, old=False)
    cfg = TrainConfig.model_validate(resolve_training({"entrypoint": "llama", "init_from": f"file://{d}",
                                                       "model": {"seq_len": 16}, "steps": 1, "batch_size": 1}))
    st = run_storage(f"file://{tmp_path}", "run")
    run_loop(llama_spec(cfg), LocalSession(), st)
    export_run(st, cfg.llama, open_storage(f"file://{tmp_path}/out"))
    with safe_open(tmp_path / "out" / "model.safetensors", framework="pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
        assert "lm_head.weight" not in f.keys()
    with pytest.raises(ValueError, match="step 7 has no committed checkpoint; committed: 1"):
        export_run(st, cfg.llama, open_storage(f"file://{tmp_path}/out2"), step=7)


def test_before_launch_token_files_beyond_the_init_from_vocabulary_are_refused(tmp_path):
    """The model's vocabulary is init_from's (300 here): a training or eval token file tokenized
    for a larger one is refused before anything launches, naming its field."""
    from spotwise.engine.plan.options import check_training_data
    from spotwise.errors import InputError
    from spotwise.taskspec import parse_taskspec, resolve_init_from

    d, _ = hf_model(tmp_path, tie=True, kv=2, scaling=False, old=False)
    small = write_tokens(tmp_path / "ok" / "tokens.bin", np.arange(200) % 300, 300)
    big = write_tokens(tmp_path / "big" / "tokens.bin", np.arange(200) % 512, 512)

    def spec(**training):
        return parse_taskspec(resolve_init_from({"name": "ft", "training": {
            "entrypoint": "llama", "init_from": f"file://{d}", "model": {"seq_len": 16}, "batch_size": 2,
            **training}}))

    assert check_training_data(spec(data={"uri": small}, eval={"data": small}), ["local"]) is not None
    from spotwise.pricing.estimate import params_from_taskspec

    n_hf = sum(p.numel() for p in transformers.LlamaForCausalLM.from_pretrained(d).parameters())
    assert params_from_taskspec(spec())[0] == n_hf          # the estimator and the plan size init_from's model
    with pytest.raises(InputError) as e:
        check_training_data(spec(data={"uri": big}), ["local"])
    assert e.value.problems[0].field == "training.data.uri" and "vocabulary of 300" in e.value.problems[0].allowed
    with pytest.raises(InputError) as e:
        check_training_data(spec(data={"uri": small}, eval={"data": big}), ["local"])
    assert e.value.problems[0].field == "training.eval.data" and "vocabulary of 300" in e.value.problems[0].allowed


def test_the_node_cache_checks_each_download_against_the_directorys_sha256_json(tmp_path):
    """A source with ``sha256.json`` (what ``spotwise export`` writes): a file whose bytes differ
    from its declared sum, or one the sums do not list, is refused naming training.init_from and
    the file, and nothing is cached; an entry missing a file is fetched again."""
    import hashlib

    from safetensors.torch import save_file

    from spotwise.errors import InputError
    from spotwise.runtime.weights.cache import MANIFEST, fetch_model

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"hidden_size": 8}')
    save_file({"model.norm.weight": torch.ones(8)}, src / "model.safetensors")
    sums = {n: hashlib.sha256((src / n).read_bytes()).hexdigest() for n in ("config.json", "model.safetensors")}
    (src / "sha256.json").write_text(json.dumps(sums))
    entry = fetch_model(f"file://{src}", root=tmp_path / "a")
    assert json.loads((entry / MANIFEST).read_text())["model.safetensors"]["sha256"] == sums["model.safetensors"]
    (entry / "model.safetensors").unlink()                        # a damaged entry is not used
    assert fetch_model(f"file://{src}", root=tmp_path / "a") == entry and (entry / "model.safetensors").is_file()

    data = bytearray((src / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF                                              # same size, other bytes
    (src / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"training.init_from.*model.safetensors: [0-9a-f]{64}, declared") as e:
        fetch_model(f"file://{src}", root=tmp_path / "b")
    assert "corrupt download" in str(e.value)
    assert not list((tmp_path / "b").rglob("model.safetensors")) and not list((tmp_path / "b").rglob(MANIFEST))

    (src / "sha256.json").write_text(json.dumps({"config.json": sums["config.json"]}))
    with pytest.raises(InputError, match="model.safetensors is not in it"):
        fetch_model(f"file://{src}", root=tmp_path / "c")
    (src / "sha256.json").write_text('{"config.json": "xyz"}')
    with pytest.raises(InputError, match="64 lowercase hex digits"):
        fetch_model(f"file://{src}", root=tmp_path / "d")
