"""What a person at a terminal gets (issue 14): the report on stdout and progress on stderr, the
verdict as the last line, each failing check with the doc section that explains it (one map,
CHECK_DOCS, whose anchors exist and which covers every check a helper can emit), the run-time
estimate against the measured tables it comes from, and the commands the README and the SKILL.md
files give, parsed by the helpers' own parsers so they cannot drift."""
from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest

from conftest import BIN, REPO, SMOKE, inprocess, main_in_process, load_script, run
from skill_runtime import reporting, streams
from policy_optimization.smoke import estimate

# the modules other test files loaded, when they did: one runtime per process, as in a real run
check = sys.modules.get("check_skill") or load_script(REPO / "scripts" / "check_skill.py", "check_skill")
WORKFLOWS = SMOKE.parents[1] / "references" / "workflows.md"
PALM_SMOKE = REPO / "sub-skills" / "palm-modeling" / "scripts" / "tiny_palm_smoke.py"
REWARD_SMOKE = REPO / "sub-skills" / "reward-modeling" / "scripts" / "tiny_reward_smoke.py"
CHECKED_SCRIPTS = [SMOKE, PALM_SMOKE, REWARD_SMOKE,
                   *sorted((REPO / "scripts" / "skill_runtime").glob("*.py")),
                   *sorted((SMOKE.parent / "policy_optimization").rglob("*.py"))]


# --- the map of check names to doc sections ------------------------------------------------------

def test_every_doc_section_a_check_points_to_exists():
    for name, target in reporting.CHECK_DOCS.items():
        page, _, anchor = target.partition("#")
        path = REPO / page
        assert path.is_file(), (name, target)
        assert not anchor or anchor in check.anchors(path), (name, target)


def emitted_check_names() -> set[str]:
    """Every check name the helpers' source can emit: ``checks.add("name", ...)``, a
    ``{"name": "...", "passed": ...}`` literal, and the per-group ``f"{key}_changed"`` checks
    (one per trainable group ``trainable_groups`` names)."""
    found = set()
    for path in CHECKED_SCRIPTS:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                if "name" in keys and "passed" in keys:
                    value = node.values[keys.index("name")]
                    if isinstance(value, ast.Constant):
                        found.add(value.value)
    source = (SMOKE.parent / "policy_optimization" / "smoke" / "checklist.py").read_text(encoding="utf-8")
    table = (SMOKE.parent / "policy_optimization" / "trainers.py").read_text(encoding="utf-8")
    groups = table.split("def trainable_groups", 1)[1].split("\ndef ", 1)[0]
    names = set(re.findall(r'"([a-z_]+)": ', groups)) | set(re.findall(r'groups\["([a-z_]+)"\]', groups))
    assert 'f"{key}_changed"' in source and names == {"actor_lora", "critic_lora", "value_head", "partition_function"}
    return found | {f"{g}_changed" for g in names}


def test_every_check_a_helper_can_emit_has_a_doc_section():
    emitted = emitted_check_names()
    assert len(emitted) > 40
    assert emitted == set(reporting.CHECK_DOCS), (f"unmapped: {sorted(emitted - set(reporting.CHECK_DOCS))}; "
                                           f"mapped but never emitted: {sorted(set(reporting.CHECK_DOCS) - emitted)}")


def test_lists_say_how_many_they_leave_out():
    assert reporting.names_text(list("abcdefgh")) == "a, b, c, d and 4 more"
    assert reporting.names_text(["a", "b"]) == "a, b" and reporting.names_text([]) == "none"


# --- stdout, stderr and the last line ------------------------------------------------------------

def test_redirected_report_keeps_the_verdict_and_progress_stays_on_stderr(smoke, capfd, monkeypatch, empty_dir):
    """`tiny-rlhf-smoke > report.txt`: the file holds the report, ending with the verdict and the
    next command; stderr holds only progress lines, one per stage with its elapsed time. (Run
    in-process as the console script runs it, stdout and stderr read at their file descriptors,
    neither a terminal.)"""
    code, out, stderr = main_in_process(smoke.main, capfd, monkeypatch, empty_dir, "--construct-only", "--device", "cpu",
                                        prog="tiny-rlhf-smoke")
    lines = out.strip().splitlines()
    assert code == 0, stderr[-2000:]
    assert lines[-1] == ("tiny-rlhf-smoke: OK: the construct-only smoke passed for ppo on the CPU (exit 0); "
                         "next: tiny-rlhf-smoke --trainer ppo")
    assert lines[0].startswith("ppo (palm_rlhf_pytorch.RLHFTrainer): all 4 checks passed")
    assert not any(line.lstrip().startswith(("ok ", "FAIL")) for line in lines)  # passing checks only counted
    assert "\r" not in stderr  # not a terminal: plain lines, no redraws (README: one line per stage)
    shown = stderr.splitlines()
    assert [line.split(": [")[0] for line in shown] == ["tiny-rlhf-smoke: import torch, palm-rlhf-pytorch and accelerate",
                                                        "tiny-rlhf-smoke: ppo: build the models and the trainer"]
    assert all(re.search(r"\[\d\d:\d\d\]$", line) for line in shown), shown
    assert list(empty_dir.iterdir()) == []


SMOKE_COMMANDS = [["tiny-rlhf-smoke", "--construct-only"], ["tiny-palm-smoke"], ["tiny-reward-smoke"]]


@pytest.mark.parametrize("argv", SMOKE_COMMANDS, ids=lambda a: a[0])
@pytest.mark.parametrize("stderr", ["full", "closed"])
@pytest.mark.slow  # starts a process: not in the quick tier
def test_a_failing_stderr_never_changes_the_report_or_its_exit_code(empty_dir, tmp_path, argv, stderr):
    """`helper 2>/dev/full` (ENOSPC) and `helper 2>&-` (no stderr): progress is best effort, so the
    report still goes to stdout with the exit code of a run whose stderr works."""
    report = tmp_path / "report.txt"
    with report.open("w") as out, open("/dev/full", "w") as full:
        proc = subprocess.run([str(BIN / argv[0]), *argv[1:], "--device", "cpu"], cwd=empty_dir, stdout=out,
                              stderr=full if stderr == "full" else None, timeout=300,
                              preexec_fn=(lambda: os.close(2)) if stderr == "closed" else None)
    lines = report.read_text(encoding="utf-8").splitlines()
    assert proc.returncode == 0 and lines and "OK" in lines[-1], lines[-3:]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FullDisk(FakeTerminal):
    writes = 0

    def write(self, text: str) -> int:
        FullDisk.writes += 1
        raise OSError(28, "No space left on device")


def test_a_best_effort_stream_is_otherwise_its_stream():
    """A user's program printing through it (streams.program_output) may ask what the stream has."""
    inner = io.StringIO()
    stream = streams.BestEffortStream(inner)
    stream.write("x")
    assert stream.getvalue() == "x" and stream.seekable() is True
    with pytest.raises(AttributeError):
        streams.BestEffortStream(None).fileno()


def test_progress_redraws_only_at_a_terminal_and_stops_after_a_failed_write():
    terminal, log = FakeTerminal(), io.StringIO()
    for stream in (terminal, log):
        progress = streams.Progress("p", True, stream)
        with progress.stage("update", total=2, unit="rollouts") as bar:
            bar.update(2)
            bar.set_postfix_str("step 1/1")
    assert "\r" in terminal.getvalue()
    assert log.getvalue() == "p: update: 2/2 rollouts [00:00, step 1/1]\n"  # the terminal's last redraw, plain
    assert terminal.getvalue().rstrip().split("\r")[-1].rstrip() == log.getvalue().strip()
    progress = streams.Progress("p", True, FullDisk())
    for _ in range(3):
        with progress.stage("stage") as bar:
            bar.set_postfix_str("x")
        progress.note("a note")
    assert FullDisk.writes == 1 and progress.stream.failed  # one failed write, then silence


@pytest.mark.slow  # starts a process: not in the quick tier
def test_tqdm_disable_hides_the_progress_lines(empty_dir):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from skill_runtime import streams\n"
            "with streams.Progress('p', True).stage('stage'): pass")
    shown = [run([sys.executable, "-c", code, str(REPO / "scripts")], empty_dir, env=env).stderr
             for env in ({}, {"TQDM_DISABLE": "1"})]
    assert shown == ["p: stage: [00:00]\n", ""]


def test_json_is_one_object_and_progress_only_when_asked(smoke, capsys, monkeypatch, empty_dir):
    code, report = inprocess(smoke, capsys, monkeypatch, empty_dir, "--construct-only")
    assert code == 0 and report["status"] == "ok"
    monkeypatch.chdir(empty_dir)
    assert smoke.main(["--json", "--progress", "--device", "cpu", "--construct-only"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["mode"] == "construct-only"
    assert "tiny-rlhf-smoke: ppo: build the models and the trainer" in err
    assert smoke.main(["--json", "--device", "cpu", "--construct-only"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.slow  # starts a process: not in the quick tier
def test_reports_md_says_when_json_prints_an_object_and_when_nothing(empty_dir):
    """reports.md said `--json` always prints one object; an error (exit 2, 3) prints none."""
    text = " ".join((REPO / "references" / "reports.md").read_text(encoding="utf-8").split())
    assert ("With `--json` a helper that reaches a verdict (exit 0 or 1; the bench's inconclusive 75 too) prints "
            "exactly one JSON object on stdout") in text
    assert "on a usage or environment error (exit 2) or a missing dependency (exit 3) stdout stays empty" in text
    proc = run([sys.executable, str(SMOKE), "--json", "--rollouts", "0"], empty_dir)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1


def test_a_failing_check_names_its_section_and_the_verdict_is_last(smoke, capsys, monkeypatch, empty_dir):
    """issue 14: `--rollouts 1` fails the weight checks; each failing check is shown in full with
    the section that explains it, and the last line says where to read."""
    monkeypatch.chdir(empty_dir)
    assert smoke.main(["--device", "cpu", "--rollouts", "1"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("ppo (palm_rlhf_pytorch.RLHFTrainer): 4 of 14 checks failed; 1 optimizer step changed 0 of 18")
    failing = [i for i, line in enumerate(out) if line.startswith("  FAIL ")]
    assert [out[i].split()[1].rstrip(":") for i in failing] == ["optimizer_steps", "actor_lora_changed",
                                                                "critic_lora_changed", "value_head_changed"]
    doc = "sub-skills/policy-optimization/references/traps-setup.md#optimizer-first-steps"
    assert all(out[i + 1].strip() == f"read: {doc}" for i in failing)
    assert "and 4 more" in out[failing[1]]  # 8 unchanged tensors: 4 named, the rest counted
    assert out[-1] == f"tiny-rlhf-smoke: FAILED: the train smoke failed for ppo on the CPU (exit 1); next: read {doc}"
    assert list(empty_dir.iterdir()) == []


def test_palm_smoke_verdict_last_and_its_failing_check_documented(capsys, monkeypatch, empty_dir):
    palm = load_script(PALM_SMOKE, "tiny_palm_smoke")
    monkeypatch.chdir(empty_dir)
    assert palm.main(["--device", "cpu", "--lr", "0", "--steps", "1"]) == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert lines[0] == "tiny-palm-smoke on the CPU: 1 of 9 checks failed"
    assert lines[1].startswith("  FAIL next_token_loss_decreases:")
    assert lines[2].strip() == "read: sub-skills/palm-modeling/references/palm-api.md#forward"
    assert lines[-1] == ("tiny-palm-smoke: FAILED (exit 1): 1 check(s) failed; next: read "
                         "sub-skills/palm-modeling/references/palm-api.md#forward")
    assert "tiny-palm-smoke: loss_step: [" in err


def test_next_command_keeps_the_form_the_run_was_started_in(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tiny-palm-smoke"])
    assert reporting.command("tiny-rlhf-smoke", "--trainer all") == "tiny-rlhf-smoke --trainer all"
    report = {"device": "cpu", "checks": [{"name": "constructed", "passed": True, "detail": ""}],
              "timings_s": {"total": 1.0}}  # a pass ends with the natural next command
    assert reporting.checks_summary("tiny-palm-smoke", report, reporting.command("tiny-reward-smoke")).splitlines()[-1] == \
        "tiny-palm-smoke: OK (exit 0); next: tiny-reward-smoke"
    monkeypatch.setattr(sys, "argv", [str(SMOKE)])
    monkeypatch.chdir(REPO)
    assert reporting.command("palm-rlhf-skill plan", "--config x.toml") == \
        "python sub-skills/policy-optimization/scripts/plan_run.py --config x.toml"
    assert set(reporting.HELPER_SCRIPTS) >= {"tiny-rlhf-smoke", "tiny-palm-smoke", "tiny-reward-smoke"}
    assert all((REPO / path).is_file() for path in reporting.HELPER_SCRIPTS.values())


# --- the estimate before a long run ---------------------------------------------------------------

def sizing_rows() -> list[list[str]]:
    section = (WORKFLOWS.parent / "sizing.md").read_text(encoding="utf-8").split("## Sizing a bigger smoke (measured)", 1)[1]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if re.match(r"\| (ppo|grpo) \|", line)]


def test_estimate_holds_every_row_of_the_measured_sizing_table_within_2x(smoke):
    rows = sizing_rows()
    assert len(rows) == 26
    for trainer, varied, dim, depth, prompt_len, max_seq_len, update, generate, _ in rows:
        args = smoke.build_parser().parse_args(["--trainer", trainer, "--dim", dim, "--depth", depth, "--prompt-len",
                                                prompt_len, "--new-tokens", str(int(max_seq_len) - int(prompt_len))])
        ratio = estimate.estimate_s(args) / (float(update) + float(generate))
        assert 0.5 <= ratio <= 2.0, (trainer, varied, round(ratio, 2))


def test_learn_estimate_is_the_calibration_tables_seconds_per_seed(smoke):
    text = WORKFLOWS.read_text(encoding="utf-8").split("### Measured pass rates", 1)[1]
    rows = [[c.strip() for c in line.strip("| \n").split(" | ")] for line in text.splitlines() if line.startswith("| ")]
    table = {r[0]: float(r[-1]) for r in rows if r[1] == "none"}
    assert table == estimate.LEARN_SECONDS_PER_SEED


def estimate_note(smoke, argv, monkeypatch, load: float | None = 0.0, cpus: int = 2) -> str:
    """The estimate line ``announce_estimate`` prints for ``argv`` at a load average of ``load``
    on ``cpus`` usable CPUs ('' when it prints none)."""
    monkeypatch.setattr(estimate, "load_average", lambda: load)
    monkeypatch.setattr(estimate.placement, "usable_cpus", lambda: cpus)
    stream = io.StringIO()
    estimate.announce_estimate(smoke.build_parser().parse_args(argv), streams.Progress("tiny-rlhf-smoke", True, stream))
    return stream.getvalue()


def test_estimate_line_before_a_run_over_30_s(smoke, monkeypatch):
    note = lambda argv: estimate_note(smoke, argv, monkeypatch)  # a quiet machine
    assert note(["--trainer", "all"]) == "" and note(["--learn", "--trainer", "grpo"]) == ""
    big = note(["--trainer", "all", "--dim", "1024", "--depth", "4", "--new-tokens", "256"])  # issue 14's run
    assert big.startswith("tiny-rlhf-smoke: this run should take about ") and " min after the imports" in big
    assert "about" in note(["--learn", "--trainer", "all"])  # 5 seeds x the four trainers: over 30 s
    assert note(["--trainer", "all", "--dim", "1024", "--depth", "4", "--new-tokens", "256", "--json"]) == big


def test_estimate_line_says_the_load_it_assumed(smoke, monkeypatch):
    """Issue 22: the learning check's estimate was 3.3x low at load average 4 to 6 on 2 CPUs. The
    line gives the quiet machine's figure, and under load how much longer the run may take."""
    quiet_s = estimate.estimate_s(smoke.build_parser().parse_args(["--learn", "--trainer", "all"]))
    quiet = estimate_note(smoke, ["--learn", "--trainer", "all"], monkeypatch, load=1.5)
    assert quiet.rstrip().endswith(f"about {reporting.seconds_text(quiet_s)} after the imports on a quiet machine "
                                   "(calibrate_learning.py's seconds per seed)"), quiet
    busy = estimate_note(smoke, ["--learn", "--trainer", "all"], monkeypatch, load=6.0)
    assert f"about {reporting.seconds_text(quiet_s)} after the imports on a quiet machine" in busy
    assert busy.rstrip().endswith(f"the load average is 6.0 on 2 usable CPUs, so it may take up to 3.0 times that, "
                                  f"{reporting.seconds_text(3 * quiet_s)}"), busy
    assert estimate_note(smoke, ["--learn", "--trainer", "all"], monkeypatch, load=None) == quiet  # no load average
    # under load a shorter run is announced too: GRPO's 5 seeds (3.3 s quiet) at 10 times the CPUs
    assert estimate_note(smoke, ["--learn", "--trainer", "grpo"], monkeypatch, load=0.0) == ""
    assert "up to 10.0 times" in estimate_note(smoke, ["--learn", "--trainer", "grpo"], monkeypatch, load=20.0)
    assert estimate.load_factor(1.0, 2) == 1.0 and estimate.load_factor(5.0, 2) == 2.5


# --- the commands the README and the SKILL.md files give -----------------------------------------

CONSOLE = {"tiny-rlhf-smoke": SMOKE, "tiny-palm-smoke": PALM_SMOKE, "tiny-reward-smoke": REWARD_SMOKE}
MARKDOWN = [REPO / "README.md", REPO / "CONTRIBUTING.md", *check.skill_files()]
SHELL_OPERATORS = {"&&", "||", "|", ";", ">", ">>", "2>", "2>&1"}


def helper_of(tokens: list[str]) -> tuple[str, list[str]] | None:
    """``(program, arguments)`` of the first helper in a shell command's tokens: a console script
    (bare or under .venv/bin/) or ``python path/to/helper.py``; None when it runs no helper."""
    for i, token in enumerate(tokens):
        name = token.removeprefix(".venv/bin/")
        if name in CONSOLE or name == "palm-rlhf-skill":
            return name, tokens[i + 1:]
        if token in ("python", "python3") and i + 1 < len(tokens) and tokens[i + 1].endswith(".py"):
            return tokens[i + 1], tokens[i + 2:]
    return None


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """``(where, program, arguments)`` of every helper command in a shell block of the README or a
    SKILL.md, and of every inline code span there that starts with one."""
    found = []
    for md in MARKDOWN:
        raw = md.read_text(encoding="utf-8")
        pieces = [body.replace("\\\n", " ") for _, info, body, _, _ in check.code_blocks(raw)
                  if info.split()[:1] in (["bash"], ["sh"])]
        lines = [line for body in pieces for line in body.splitlines()]
        lines += re.findall(r"`((?:\.venv/bin/)?(?:tiny-[a-z]+-smoke|palm-rlhf-skill|python3? )[^`]*)`",
                            check.strip_code_blocks(raw))
        for line in lines:
            command: list[str] = []
            for token in [*shlex.split(line, comments=True), "&&"]:  # one shell command at a time
                if token not in SHELL_OPERATORS:
                    command.append(token)
                    continue
                helper = helper_of(command)
                if helper and (helper[0] != "palm-rlhf-skill" or helper[1]):  # not the bare name in prose
                    found.append((md.relative_to(REPO).as_posix(), *helper))
                command = []
    return found


def parser_of(program: str, arguments: list[str]):
    """(the helper's argparse parser, the arguments it parses); None for install/list/uninstall/
    doctor, whose options are checked against their --help."""
    if program in CONSOLE:
        return load_script(CONSOLE[program], CONSOLE[program].stem).build_parser(), arguments
    if program == "palm-rlhf-skill":
        cli = pytest.importorskip("palm_rlhf_skill.cli")
        sub, rest = arguments[0], arguments[1:]
        kind, target, _ = cli.SUBCOMMANDS[sub]
        path = REPO / reporting.HELPER_SCRIPTS[target] if kind == "script" else None
        return (load_script(path, path.stem).build_parser() if path else None), rest
    path = next(p for p in (REPO / program, REPO / program.split("palm-rlhf-pytorch/", 1)[-1]) if p.is_file())
    return load_script(path, path.stem).build_parser(), arguments


def help_text(sub: str) -> str:
    from palm_rlhf_skill import cli
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.dispatch([sub, "--help"])
    return out.getvalue()


def test_every_documented_command_is_a_real_helper_with_real_options():
    """Each helper command of the README and the SKILL.md files: a console script the package
    installs (so, in the activated venv, it runs as typed), or a script path that exists from the
    skill root (the one base for running by path), with arguments its own parser accepts."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    commands = documented_commands()
    assert len(commands) > 25
    seen = set()
    for where, program, arguments in commands:
        assert program in scripts or program.endswith(".py"), (where, program)
        if program.endswith(".py"):
            assert program.startswith(("sub-skills/", "scripts/", "tools/", ".claude/skills/palm-rlhf-pytorch/sub-skills/")), \
                (where, program)  # paths from the skill root (or an installed copy's root)
        parser, args = parser_of(program, arguments)
        if not args:  # a command named in prose (`palm-rlhf-skill plan`): it exists, nothing to parse
            pass
        elif parser is None:
            text = help_text(arguments[0])
            assert all(a in text for a in args if a.startswith("--")), (where, program, arguments)
        else:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    parser.parse_args(args)
            except SystemExit as exc:  # --help exits 0; a usage error exits 2
                assert exc.code == 0, f"{where}: {program} {' '.join(arguments)}: rejected by its parser"
        seen.add(program if program in scripts else "by path")
    assert seen == {"tiny-rlhf-smoke", "tiny-palm-smoke", "tiny-reward-smoke", "palm-rlhf-skill", "by path"}


def test_one_first_command_everywhere():
    """The README's main job, the root SKILL.md, every sub-skill's first step and doctor's next step
    give the same first command (reporting.FIRST_COMMAND)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    main_job = next(line for line in readme.splitlines() if line.startswith("python3 -m venv .venv") and "pytest" not in line)
    assert main_job.endswith("&& .venv/bin/" + reporting.FIRST_COMMAND)
    assert "`. .venv/bin/activate`" in readme.split(main_job, 1)[1].split("\n## ", 1)[0]  # activate once, stated once
    root = (REPO / "SKILL.md").read_text(encoding="utf-8").split("## First step", 1)[1]
    assert f"```bash\n{reporting.FIRST_COMMAND}\n```" in root
    for skill in check.skill_files():
        if skill.parent != REPO:
            first = skill.read_text(encoding="utf-8").split("## Start here", 1)[1].split("\n2. ", 1)[0]
            assert f"`{reporting.FIRST_COMMAND}`" in " ".join(first.split()), skill
    doctor = pytest.importorskip("palm_rlhf_skill.doctor")
    assert doctor.NEXT_STEP[0].endswith("next: " + reporting.FIRST_COMMAND)


def test_readme_says_which_options_the_sibling_smokes_share():
    """The sibling smokes share the options the README lists as common, and have exactly the own
    options it names (it once said "the same options", which was not true)."""
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    common = set(re.findall(r"`(--[a-z-]+)`", readme.split("common options ", 1)[1].split(";", 1)[0]))
    own = set(re.findall(r"`(--[a-z-]+)`", readme.split("their own options are ", 1)[1].split("(", 1)[0]))
    options = {name: {max(a.option_strings, key=len) for a in load_script(path, path.stem).build_parser()._actions} - {"--help"}
               for name, path in CONSOLE.items()}
    assert common and all(common <= opts for opts in options.values())
    assert options["tiny-palm-smoke"] - common == own == options["tiny-reward-smoke"] - common


LIBRARY_MODULES = [REPO / "scripts" / "skill_runtime", REPO / "scripts" / "probe_kit.py", REPO / "scripts" / "ddp_fixes.py",
                   REPO / "scripts" / "skill_bootstrap.py",
                   REPO / "sub-skills" / "reward-modeling" / "scripts" / "rule_reward.py"]


@pytest.mark.parametrize("module", LIBRARY_MODULES, ids=lambda p: p.name)
@pytest.mark.parametrize("argv", [[], ["--help"]])
@pytest.mark.slow  # starts a process: not in the quick tier
def test_a_module_run_by_path_says_it_is_one(empty_dir, module, argv):
    """QA P16: these exited 0 silently (rule_reward.py after importing torch); every other script
    under scripts/ has a command line of its own."""
    from conftest import usage_error_without_torch
    line = usage_error_without_torch(module, argv, empty_dir)
    assert line.startswith(f"{module.name}: error: a module, not a command: ")
    if module.name == "skill_runtime":  # a copy of the tree has no console scripts: the by-path form
        assert line.endswith(f"e.g. python {SMOKE} --help"), line
    scripts = [*REPO.glob("scripts/*.py"), *REPO.glob("sub-skills/*/scripts/*.py")]
    silent = [p.name for p in scripts if 'if __name__ == "__main__"' not in p.read_text(encoding="utf-8")]
    assert silent == []  # no script of the tree does nothing when run


def test_contributing_names_files_that_exist():
    """CONTRIBUTING.md's recipes name real files and tests (the commands are checked with the
    README's, test_every_documented_command_is_a_real_helper_with_real_options)."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:scripts|sub-skills|tests|references|src)/[\w./-]+\.(?:py|md|json))", text))
    assert len(named) > 8 and all((REPO / n).is_file() for n in named), sorted(n for n in named if not (REPO / n).is_file())
