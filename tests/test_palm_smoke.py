"""The palm-modeling sub-skill: its smoke helper (in-process, by path, console script) and the
facts its markdown states about palm-rlhf-pytorch's PaLM."""
from __future__ import annotations

import inspect
import math
import re
import sys
import warnings

import pytest

import probe_kit
from conftest import BIN, REPO, inprocess, load_script, run, run_json, usage_error_without_torch

SUBSKILL = REPO / "sub-skills" / "palm-modeling"
PALM_SMOKE = SUBSKILL / "scripts" / "tiny_palm_smoke.py"
CHECK_NAMES = ["constructed", "next_token_loss_decreases", "generate_with_prompt", "generate_without_prompt",
               "fresh_lora_scope_is_identity", "lora_scope_isolated", "merge_reproduces_scoped_logits",
               "save_load_round_trip", "caller_directory_untouched"]
TOP_KEYS = {"status", "device", "seed", "cpu_threads", "versions", "tested", "warnings", "config", "model", "loss",
            "generate", "lora", "save_load", "checks", "library_output", "timings_s"}
TINY = probe_kit.TINY_PALM  # the one tiny config (scripts/probe_kit.py)


@pytest.fixture(scope="module")
def palm_smoke():
    return load_script(PALM_SMOKE, "tiny_palm_smoke")



def test_in_process_report(palm_smoke, capsys, monkeypatch, empty_dir):
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the smoke's 1 (the suite's processes run one thread: tests/conftest.py)
    try:
        code, report = inprocess(palm_smoke, capsys, monkeypatch, empty_dir)
        assert torch.get_num_threads() == 2  # --cpu-threads applies only while the checks run
    finally:
        torch.set_num_threads(threads)
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    assert report["status"] == "ok" and report["device"] == "cpu" and TOP_KEYS <= report.keys()
    assert report["cpu_threads"] == 1
    assert [c["name"] for c in report["checks"]] == CHECK_NAMES
    assert report["config"] == TINY
    assert report["loss"]["after"] < report["loss"]["before"] and len(report["loss"]["per_step"]) == 3
    assert report["generate"]["with_prompt"] == {"prompt_shape": [2, 5], "shape": [2, 7], "full_shape": [2, 12]}
    assert report["generate"]["without_prompt"]["shape"] == [1, 12]
    lora = report["lora"]
    assert lora["merge_max_abs_diff"] <= lora["merge_atol"] == 1e-4 and lora["scoped_max_abs_effect"] > 1e-3
    assert lora["tensors"] == 8  # q, k, v, out: A and B each, one layer
    assert report["save_load"]["max_abs_diff"] == 0.0 and report["save_load"]["bytes"] > 0
    assert set(report["timings_s"]) == {"import", "construct", "loss_step", "generate", "lora", "save_load", "total"}
    assert list(empty_dir.iterdir()) == []


def test_deterministic_under_seed(palm_smoke, capsys, monkeypatch, empty_dir):
    _, a = inprocess(palm_smoke, capsys, monkeypatch, empty_dir, "--seed", "3")
    _, b = inprocess(palm_smoke, capsys, monkeypatch, empty_dir, "--seed", "3")
    assert a["loss"] == b["loss"] and a["lora"] == b["lora"]


def test_cli_by_path_json_from_empty_dir(empty_dir):
    proc, report = run_json([sys.executable, str(PALM_SMOKE), "--json"], empty_dir)
    assert proc.returncode == 0 and report["status"] == "ok", proc.stderr[-2000:]
    assert report["device"] == "cpu" and report["checks"][-1]["passed"]
    assert list(empty_dir.iterdir()) == []


def test_installed_console_script(empty_dir):
    exe = BIN / "tiny-palm-smoke"
    assert exe.exists(), "install the package first: pip install '.[test]'"
    proc, report = run_json([str(exe), "--json", "--device", "cpu"], empty_dir)
    assert proc.returncode == 0 and report["status"] == "ok", proc.stderr[-2000:]
    assert list(empty_dir.iterdir()) == []


def test_forced_failure_exits_1(palm_smoke, capsys, monkeypatch, empty_dir):
    code, report = inprocess(palm_smoke, capsys, monkeypatch, empty_dir, "--lr", "0")
    assert code == 1 and report["status"] == "failed"
    assert [c["name"] for c in report["checks"] if not c["passed"]] == ["next_token_loss_decreases"]


@pytest.mark.parametrize("argv", [["--bogus"], ["--steps", "0"], ["--lr", "-1"], ["--cpu-threads", "0"],
                                  ["--lr", "nan"], ["--steps", "100000000"], ["--seed", "-1"], ["--cpu-threads", "100000"], ["--device", "tpu"]])
def test_usage_errors_one_line_exit_2(empty_dir, argv):
    usage_error_without_torch(PALM_SMOKE, argv, empty_dir)


def test_help_without_torch(empty_dir):
    proc = run([sys.executable, "-X", "importtime", str(PALM_SMOKE), "--help"], empty_dir)
    assert proc.returncode == 0 and "--steps" in proc.stdout and "exit codes" in proc.stdout
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


# facts stated in sub-skills/palm-modeling/*.md (their code blocks run in test_doc_code_blocks.py)

def test_constructor_table_matches_signature():
    from palm_rlhf_pytorch import PaLM
    doc = (SUBSKILL / "references" / "palm-api.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| (required|`[^`]*`) \|", doc, re.M))
    params = {n: p for n, p in inspect.signature(PaLM.__init__).parameters.items() if n != "self"}
    assert set(rows) == set(params)
    for name, param in params.items():
        assert param.kind is inspect.Parameter.KEYWORD_ONLY
        if param.default is inspect.Parameter.empty:
            assert rows[name] == "required"
        else:
            assert eval(rows[name].strip("`"), {}) == param.default, name


def test_generate_and_forward_signatures_as_documented():
    from palm_rlhf_pytorch import PaLM
    doc = (SUBSKILL / "references" / "palm-api.md").read_text(encoding="utf-8")
    # generate is wrapped by eval_decorator (no functools.wraps): read its definition from the source
    import ast
    import palm_rlhf_pytorch.palm as palm_module
    tree = ast.parse(inspect.getsource(palm_module))
    palm_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PaLM")
    gen_def = next(n for n in palm_class.body if isinstance(n, ast.FunctionDef) and n.name == "generate")
    names = [a.arg for a in gen_def.args.args] + [gen_def.args.kwarg.arg]
    defaults = dict(zip([a.arg for a in gen_def.args.args][-len(gen_def.args.defaults):],
                        [ast.unparse(d) for d in gen_def.args.defaults]))
    assert defaults == {"prompt": "None", "temperature": "1.0", "filter_logits_fn": "top_k", "filter_thres": "0.9",
                        "pad_value": "0.0", "eos_token": "None", "return_seq_without_prompt": "True",
                        "use_tqdm": "False"}
    assert "filter_thres=0.9" in doc and "temperature=1.0" in doc and "pad_value=0.0" in doc  # generated block
    assert names[1:] == ["seq_len", "prompt", "temperature", "filter_logits_fn",
                                               "filter_thres", "pad_value", "eos_token",
                                               "return_seq_without_prompt", "use_tqdm", "kwargs"]
    assert "(26 of 257)" in doc
    assert math.ceil((1 - 0.9) * 257) == 26
    fwd = inspect.signature(PaLM.forward)
    assert list(fwd.parameters)[1:] == ["x", "return_loss", "disable_lora", "finetune_scope", "extra_embed",
                                        "return_only_embedding", "return_logits_with_embedding"]


def test_flash_attn_matches_and_warns():
    import torch
    from palm_rlhf_pytorch import PaLM
    torch.manual_seed(0)
    plain = PaLM(**TINY).eval()
    flash = PaLM(**TINY, flash_attn=True).eval()
    flash.load_state_dict(plain.state_dict())
    x = torch.randint(1, 257, (2, 9))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        diff = (flash(x) - plain(x)).abs().max().item()
    assert diff < 1e-6
    assert any(w.category is FutureWarning and "sdp_kernel" in str(w.message) for w in caught)



def palm_api(section: str, what: str) -> str:
    return f"upstream PaLM changed: {what}. Update palm-modeling/references/palm-api.md#{section}, then this test."


def test_flash_attn_kernels_by_gpu(monkeypatch):
    """palm-api#constructor: with CUDA, only compute capability 8.0 gets the flash kernel (fake GPU;
    attention.py:58-68); the cuda_config set per layer is what the flash path reads."""
    import types
    import torch
    import palm_rlhf_pytorch.attention as attention
    from palm_rlhf_pytorch import PaLM
    Config = attention.Config
    said = []
    monkeypatch.setattr(attention, "print_once", said.append)  # the library prints once per process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for (major, minor), want in {(8, 0): Config(True, False, False), (9, 0): Config(False, True, True),
                                 (8, 6): Config(False, True, True)}.items():
        props = types.SimpleNamespace(major=major, minor=minor)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, props=props: props)
        said.clear()
        palm = PaLM(**TINY, flash_attn=True)
        configs = {layer.fn.attend.cuda_config for layer in palm.layers}
        assert configs == {want}, palm_api("constructor", f"sm {major}.{minor} gets {configs}")
        prefix = "A100 GPU detected" if (major, minor) == (8, 0) else "Non-A100 GPU detected, using math or mem"
        assert said and said[0].startswith(prefix), palm_api("constructor", f"message {said}")
    source = inspect.getsource(attention.Attention.flash_attn)
    assert "config = self.cuda_config if is_cuda else self.cpu_config" in source, palm_api("constructor", "config read")


def test_size_no_bias_beta_buffer_tied_twice():
    """palm-api#constructor: the parameter formula (non-default ff_mult too), no Linear bias, beta a
    buffer, a state_dict sum counting the tied embedding twice."""
    import torch
    from palm_rlhf_pytorch import PaLM
    V, d, L, h, dh, m = 100, 24, 2, 3, 8, 2
    palm = PaLM(num_tokens=V, dim=d, depth=L, heads=h, dim_head=dh, ff_mult=m)
    n = sum(p.numel() for p in palm.parameters())
    assert n == V * d + L * (d * (h * dh + 2 * dh + 2 * m * d) + h * dh * d + m * d * d + d) + d, palm_api("constructor", n)
    assert all(mod.bias is None for mod in palm.modules() if isinstance(mod, torch.nn.Linear))
    assert all("beta" in dict(mod.named_buffers()) and "beta" not in dict(mod.named_parameters())
               for mod in palm.modules() if type(mod).__name__ == "LayerNorm")
    buffers = sum(b.numel() for b in palm.buffers())
    assert sum(t.numel() for t in palm.state_dict().values()) == n + V * d + buffers


def test_qk_scale_never_read_and_the_fix():
    """palm-api#constructor: qk_rmsnorm's qk_scale is stored, never read; logits start within about
    dim_head**-0.5; q_scale = k_scale = sqrt(8 sqrt(dh)) multiplies them by 8 sqrt(dh)."""
    import torch
    from palm_rlhf_pytorch import PaLM
    torch.manual_seed(0)
    dh = 16
    palm = PaLM(**{**TINY, "dim_head": dh}, qk_rmsnorm=True)
    block = palm.layers[0].fn
    assert block.scale == 8 and "qk_scale" not in inspect.signature(PaLM.__init__).parameters
    x = torch.randint(1, 257, (2, 12))
    out = palm(x)
    block.scale = 1e6
    assert torch.equal(palm(x), out), palm_api("constructor", "qk_scale is now used")
    seen = []
    forward = block.attend.forward
    def record(q, k, v, mask=None):
        seen.append((torch.einsum("b h i d, b j d -> b h i j", q, k) * dh ** -0.5).abs().max().item())
        return forward(q, k, v, mask=mask)
    block.attend.forward = record
    palm(x)
    with torch.no_grad():
        block.q_scale.fill_((8 * dh ** 0.5) ** 0.5)
        block.k_scale.fill_((8 * dh ** 0.5) ** 0.5)
    palm(x)
    assert seen[0] < 1.2 * dh ** -0.5, palm_api("constructor", f"initial logits up to {seen[0]}")
    assert seen[1] / seen[0] == pytest.approx(8 * dh ** 0.5, rel=1e-4) and seen[1] <= 8


def test_non_causal_return_loss_sees_the_label():
    """palm-api#forward: with causal=False position t attends to its label t+1, so training on
    uniform random tokens drives the loss below ln(63), the best a causal model can reach."""
    import torch
    losses = {}
    for causal in (True, False):
        torch.manual_seed(0)
        palm = probe_kit.tiny_palm(num_tokens=64, causal=causal)  # 64 ids: 40 steps reach below ln(63)
        x = torch.randint(1, 64, (1, 8))
        y = x.clone()
        y[:, 5] = y[:, 5] % 63 + 1                                   # change token 5 only
        assert torch.equal(palm(x)[:, 4], palm(y)[:, 4]) is causal, palm_api("forward", f"causal={causal}")
        opt = torch.optim.Adam(palm.parameters(), lr=1e-2)
        for _ in range(40):
            loss = palm(torch.randint(1, 64, (8, 17)), return_loss=True)
            loss.backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():                                       # fresh tokens: no memorising
            losses[causal] = palm(torch.randint(1, 64, (64, 17)), return_loss=True).item()
    assert losses[False] < math.log(63) - 0.2 and losses[True] > math.log(63) - 0.05, palm_api("forward", losses)

def test_scoped_training_also_reaches_base_weights():
    import torch
    from palm_rlhf_pytorch import PaLM
    palm = PaLM(**TINY)
    palm.add_finetune_params("task")
    palm(torch.randint(1, 257, (2, 8)), return_loss=True, finetune_scope="task").backward()
    assert palm.token_emb.weight.grad is not None  # so optimize finetune_parameters(scope) only
    assert isinstance(palm.palm_parameters(), set)
    assert palm.set_dropout(0.) is palm


def test_lora_init_and_rank():
    from palm_rlhf_pytorch import PaLM
    palm = PaLM(**TINY)
    palm.add_finetune_params("a")
    palm.add_finetune_params("b", lora_r=2)
    q, k, v, o = palm.finetune_modules["a"][0]
    assert q.A.shape == (32, 8) and q.B.shape == (8, 32) and k.B.shape == (8, 16) and o.A.shape == (32, 8)
    assert q.scale == 1.0 and all((m.B == 0).all() for m in (q, k, v, o))
    assert palm.finetune_modules["b"][0][0].A.shape == (32, 2)
    removed = palm.remove_finetune_params("b")
    assert type(removed).__name__ == "ModuleList" and list(palm.finetune_modules) == ["a"]
    with pytest.raises(AssertionError, match="finetune scope a already found"):
        palm.add_finetune_params("a")


def test_skill_md_frontmatter_and_links():
    text = (SUBSKILL / "SKILL.md").read_text(encoding="utf-8")
    assert re.search(r"^name: palm-modeling$", text, re.M)
    assert re.search(r"^disable-model-invocation: true$", text, re.M)
    description = re.search(r"^description: (.+)$", text, re.M).group(1)
    assert len(description) <= 1024 and "reward-modeling" in description and "policy-optimization" in description
    for md in [SUBSKILL / "SKILL.md", *sorted((SUBSKILL / "references").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+\.md)\)", md.read_text(encoding="utf-8")):
            assert (md.parent / target).resolve().is_file(), f"{md.name} links missing {target}"
    do_not_use = text.split("## Do not use for")[1].split("##")[0]
    assert "../policy-optimization/SKILL.md" in do_not_use and "../reward-modeling/SKILL.md" in do_not_use


def test_generate_details_as_documented():
    import torch
    from palm_rlhf_pytorch import PaLM
    from palm_rlhf_pytorch.utils import top_p
    import palm_rlhf_pytorch.attention as attention
    torch.manual_seed(0)
    palm = PaLM(**TINY)
    prompt = torch.randint(1, 257, (2, 4))
    palm.train()
    assert palm.generate(6, prompt=prompt[0]).shape == (2,)        # 1-D prompt, 1-D result
    assert palm.training                                             # training mode restored
    assert palm.generate(6, prompt=prompt, filter_logits_fn=top_p).shape == (2, 2)
    assert palm.generate(6, prompt=prompt, filter_logits_fn=None).shape == (2, 2)
    with pytest.raises(AssertionError):                              # **kwargs reach forward
        palm.generate(6, prompt=prompt, finetune_scope="no-such-scope")
    assert palm.layers[0].fn.rotary_emb.use_xpos
    assert not PaLM(**TINY, causal=False).layers[0].fn.rotary_emb.use_xpos  # xPos only when causal
    assert "must be using pytorch 2.0 or above" in inspect.getsource(attention)
    palm.add_finetune_params("actor")
    assert any(k.startswith("finetune_modules.actor.") for k in palm.state_dict())
