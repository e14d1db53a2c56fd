"""``palm-rlhf-skill install | uninstall | list``: copies into agents' skills folders, in temp dirs.

HOME points at a temporary folder in every test, so the user scope never touches the real home.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import skills_ref

from conftest import BIN, REPO, one_error_line, run, run_json
from palm_rlhf_skill import install as inst
from skill_tree import files_with_hashes, repo_skill_files
from doc_tables import assert_keys_documented

NAME = "palm-rlhf-pytorch"
SMOKE_IN_COPY = "sub-skills/policy-optimization/scripts/tiny_rlhf_smoke.py"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch) -> Path:
    """A temporary HOME (Path.home() reads it) for in-process calls and subprocesses alike."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def project(empty_dir: Path, monkeypatch) -> Path:
    monkeypatch.chdir(empty_dir)
    return empty_dir


def repo_tree() -> dict[str, str]:
    return repo_skill_files()


def test_skill_name_is_the_root_frontmatter_name():
    assert inst.skill_name(REPO) == NAME
    assert skills_ref.read_properties(REPO).name == NAME


def test_install_claude_project_copies_the_tree_and_validates(project, capsys):
    assert inst.main(["--target", "claude", "--scope", "project"]) == 0
    dest = project / ".claude" / "skills" / NAME
    assert capsys.readouterr().out.strip() == f"installed {dest} ({len(repo_tree())} files)"
    assert files_with_hashes(dest) == repo_tree()  # every file of the tree, byte for byte, no extras
    assert {"SKILL.md", "LICENSE", "references", "scripts", "sub-skills"} == {p.name for p in dest.iterdir()}
    assert not [p for p in dest.rglob("*") if p.name == "__pycache__" or p.suffix == ".pyc"]
    assert skills_ref.validate(dest) == []  # the folder name now equals the skill name
    assert [p.name for p in project.iterdir()] == [".claude"]
    assert not list(dest.parent.glob(".*"))  # no staging folder left beside it


def test_identical_copy_is_left_alone_with_exit_0(project, capsys):
    assert inst.main([]) == 0
    dest = project / ".claude" / "skills" / NAME
    (dest / "scripts" / "__pycache__").mkdir()  # running a script writes byte code: not a difference
    (dest / "scripts" / "__pycache__" / "skill_runtime.cpython-311.pyc").write_bytes(b"\0")
    capsys.readouterr()
    assert inst.main([]) == 0
    assert "already up to date" in capsys.readouterr().out


def test_different_copy_needs_force(project, capsys):
    assert inst.main(["--target", "agents"]) == 0
    dest = project / ".agents" / "skills" / NAME
    edited = dest / "SKILL.md"
    edited.write_text(edited.read_text(encoding="utf-8") + "\nlocal edit\n", encoding="utf-8")
    (dest / "notes.txt").write_text("mine\n", encoding="utf-8")
    capsys.readouterr()

    assert inst.main(["--target", "agents"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "already holds a different copy (1 changed, 0 missing, 1 extra file(s))" in line
    assert "--force" in line
    assert "local edit" in edited.read_text(encoding="utf-8") and (dest / "notes.txt").exists()

    assert inst.main(["--target", "agents", "--force"]) == 0
    assert capsys.readouterr().out.startswith(f"replaced {dest} ")
    assert files_with_hashes(dest) == repo_tree()
    assert sorted(p.name for p in dest.parent.iterdir()) == [NAME]  # old copy and staging gone


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_force_never_replaces_what_is_not_a_copy_of_the_skill(project, capsys, kind):
    """The QA's data loss: `install --force` deleted a folder that uninstall refuses to touch."""
    skills = project / "skills"
    if kind == "folder":
        (skills / NAME).mkdir(parents=True)
        (skills / NAME / "notes.txt").write_text("precious\n", encoding="utf-8")
    else:
        skills.mkdir()
        (skills / NAME).write_text("not a folder\n", encoding="utf-8")
    for argv in (["--target", "./skills"], ["--target", "./skills", "--force"]):
        assert inst.main(argv) == 1
        line = one_error_line(capsys.readouterr().err)
        assert f"is not a copy of the {NAME} skill ({'a folder whose SKILL.md' if kind == 'folder' else 'a file'}" in line
        assert "different copy" not in line
    assert inst.uninstall_main(["--target", "./skills"]) == 1  # the same test, the same words
    assert f"is not a copy of the {NAME} skill" in one_error_line(capsys.readouterr().err)
    kept = skills / NAME / "notes.txt" if kind == "folder" else skills / NAME
    assert kept.read_text(encoding="utf-8") in ("precious\n", "not a folder\n")


def test_concurrent_uninstalls_remove_once_and_agree(project, home):
    """The QA saw 'is not a copy' (exit 1) and 'cannot remove references' (exit 2) from parallel
    uninstalls of one copy: exactly one removes it, the others find nothing there (exit 0)."""
    for _ in range(3):
        assert inst.main(["--target", "./par"]) == 0
        procs = [subprocess.Popen([str(BIN / "palm-rlhf-skill"), "uninstall", "--target", "./par"], cwd=project,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
        assert [code for code, _, _ in results] == [0] * 4, results
        assert sum(out.startswith("removed ") for _, out, _ in results) == 1, results
        assert list((project / "par").iterdir()) == []  # no private folder left behind


@pytest.mark.parametrize("target", ["cursor", "claude-code", ""])
def test_unknown_target_exits_2_with_one_line(project, capsys, target):
    assert inst.main(["--target", target]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"unknown target {target!r}" in line and "claude, agents" in line
    assert list(project.iterdir()) == []


def test_bad_scope_is_a_one_line_usage_error(project, capsys):
    with pytest.raises(SystemExit) as exc:
        inst.main(["--scope", "system"])
    assert exc.value.code == 2
    assert "invalid choice: 'system'" in one_error_line(capsys.readouterr().err)


def test_nested_relative_and_absolute_paths_are_created(project, tmp_path, capsys):
    assert inst.main(["--target", "./tools/agent/skills"]) == 0
    assert files_with_hashes(project / "tools/agent/skills" / NAME) == repo_tree()
    absolute = tmp_path / "elsewhere" / "deep" / "skills"
    assert inst.main(["--target", str(absolute)]) == 0
    assert files_with_hashes(absolute / NAME) == repo_tree()


def test_user_scope_and_tilde_go_under_home(project, home):
    assert inst.main(["--target", "claude", "--scope", "user"]) == 0
    assert inst.main(["--target", "agents", "--scope", "user"]) == 0
    assert inst.main(["--target", "~/custom/skills"]) == 0
    for skills in (".claude/skills", ".agents/skills", "custom/skills"):
        assert files_with_hashes(home / skills / NAME) == repo_tree()
    assert list(project.iterdir()) == []


def test_destination_that_cannot_be_written_exits_2(project, capsys):
    (project / ".claude").write_text("a file where a folder must go\n", encoding="utf-8")
    assert inst.main(["--target", "claude"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert ".claude is a file, not a directory" in line
    (project / "afile").write_text("x\n", encoding="utf-8")
    assert inst.main(["--target", "./afile/skills"]) == 2
    assert "afile is a file, not a directory" in one_error_line(capsys.readouterr().err)


def test_user_scope_needs_an_existing_home(project, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "no" / "such" / "home"))
    assert inst.main(["--target", "claude", "--scope", "user"]) == 2
    assert "does not exist (set HOME)" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("target", ["claude", "agents"])
def test_uninstall_twice_exits_0_and_leaves_no_empty_folder(project, capsys, target):
    """Like install, uninstall is idempotent; the .claude/skills (.agents/skills) and .claude
    (.agents) folders that install created go when they are left empty."""
    assert inst.main(["--target", target]) == 0
    dest = project / f".{target}" / "skills" / NAME
    assert inst.uninstall_main(["--target", target]) == 0
    assert capsys.readouterr().out.strip().endswith(f"removed {dest}")
    assert list(project.iterdir()) == []  # no empty .claude/ or .agents/ left behind

    assert inst.uninstall_main(["--target", target]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"{dest}: not installed there; nothing to do" and captured.err == ""
    assert list(project.iterdir()) == []


def test_uninstall_keeps_a_claude_folder_that_holds_more(project, capsys):
    assert inst.main(["--target", "claude"]) == 0
    (project / ".claude" / "settings.json").write_text("{}\n", encoding="utf-8")
    assert inst.uninstall_main(["--target", "claude"]) == 0
    assert sorted(p.name for p in (project / ".claude").iterdir()) == ["settings.json"]


def test_an_install_that_loses_the_race_ends_up_to_date(project, monkeypatch, capsys):
    """Another install places an identical copy between this one's look and its rename (what
    concurrent installs into one directory do): this one reports the copy as up to date, exit 0,
    instead of failing on the rename with 'Directory not empty'."""
    real, raced = inst._copy_tree, []

    def copy_then_lose_the_race(source, staging):
        real(source, staging)
        if not raced:
            raced.append(True)
            assert inst.install("./skills", "project", force=False)[0] == "installed"  # the winner

    monkeypatch.setattr(inst, "_copy_tree", copy_then_lose_the_race)
    assert inst.main(["--target", "./skills"]) == 0, capsys.readouterr().err
    assert "already up to date" in capsys.readouterr().out
    assert files_with_hashes(project / "skills" / NAME) == repo_tree()
    assert sorted(p.name for p in (project / "skills").iterdir()) == [NAME]  # no staging left


def test_concurrent_identical_installs_all_exit_0(project, home):
    procs = [subprocess.Popen([str(BIN / "palm-rlhf-skill"), "install", "--target", "./t"], cwd=project,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert [code for code, _ in results] == [0] * 6, results
    assert files_with_hashes(project / "t" / NAME) == repo_tree()
    assert sorted(p.name for p in (project / "t").iterdir()) == [NAME]


def test_an_install_that_races_an_uninstall_installs_again(project, monkeypatch, capsys):
    """Issue 22, item 2: an uninstall takes the copy away while this install reads it. The
    install used to take the vanished folder for a file that is not a copy ('is not a copy ...
    (a file) ... remove it by hand', exit 1); it looks again and installs (exit 0)."""
    assert inst.main(["--target", "./skills"]) == 0
    capsys.readouterr()
    dest = (project / "skills" / NAME).resolve()
    real, raced = inst.tree_files, []

    def uninstalled_while_read(root, items=None):
        if Path(root).resolve() == dest and not raced:
            raced.append(True)
            assert inst.uninstall("./skills", "project") == (project / "skills" / NAME, True)
        return real(root, items)

    monkeypatch.setattr(inst, "tree_files", uninstalled_while_read)
    assert inst.main(["--target", "./skills"]) == 0, capsys.readouterr().err
    assert raced and capsys.readouterr().out.startswith("installed ")
    assert files_with_hashes(dest) == repo_tree()
    assert sorted(p.name for p in (project / "skills").iterdir()) == [NAME]  # no staging or old folder left


def test_an_uninstall_that_races_an_install_does_not_call_the_copy_edited(project, monkeypatch, capsys):
    """Another uninstall takes the copy and an install puts a new one back while this uninstall
    reads it: the files it read are a mixture, not an edited copy; it looks again and removes the
    new copy (exit 0) instead of refusing with 'differs from this package's copy' (exit 1)."""
    assert inst.main(["--target", "./skills"]) == 0
    dest = (project / "skills" / NAME).resolve()
    real, raced = inst.tree_files, []

    def replaced_while_read(root, items=None):
        files = real(root, items)
        if Path(root).resolve() == dest and not raced:
            raced.append(True)
            files.popitem()  # what this look had read when the folder went away
            assert inst.uninstall("./skills", "project")[1] and inst.install("./skills", "project", False)[0] == "installed"
        return files

    monkeypatch.setattr(inst, "tree_files", replaced_while_read)
    capsys.readouterr()
    assert inst.uninstall_main(["--target", "./skills"]) == 0, capsys.readouterr().err
    assert raced and capsys.readouterr().out.startswith("removed ") and not dest.exists()


def test_installs_and_uninstalls_of_one_copy_at_once_all_exit_0(project, home):
    """Several installs and uninstalls of one copy at once (the QA's race, for real): every one
    exits 0 with nothing on stderr; afterwards the copy is absent or identical, nothing else left."""
    command = [str(BIN / "palm-rlhf-skill")]
    for _ in range(4):
        procs = [subprocess.Popen([*command, verb, "--target", "./race"], cwd=project, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for _ in range(3) for verb in ("install", "uninstall")]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
        for p in procs:
            p.stdout.close()
            p.stderr.close()
        assert results == [(0, "")] * len(procs), results
        left = sorted(p.name for p in (project / "race").iterdir()) if (project / "race").exists() else []
        assert left in ([], [NAME]), left
        if left:
            assert files_with_hashes(project / "race" / NAME) == repo_tree()


def test_uninstall_refuses_a_folder_that_is_not_this_skill(project, capsys):
    foreign = project / "skills" / NAME
    foreign.mkdir(parents=True)
    (foreign / "SKILL.md").write_text("---\nname: something-else\ndescription: x\n---\n", encoding="utf-8")
    assert inst.uninstall_main(["--target", "./skills"]) == 1
    assert "is not a copy of the palm-rlhf-pytorch skill" in one_error_line(capsys.readouterr().err)
    assert (foreign / "SKILL.md").exists()


def test_uninstall_keeps_an_edited_copy_without_force(project, capsys):
    """install protects a copy that differs from the package's; uninstall does too: exit 1, one
    line naming --force, the copy kept; --force removes it."""
    assert inst.main(["--target", "claude"]) == 0
    dest = project / ".claude" / "skills" / NAME
    (dest / "SKILL.md").write_text((dest / "SKILL.md").read_text(encoding="utf-8") + "my note\n", encoding="utf-8")
    capsys.readouterr()
    assert inst.uninstall_main(["--target", "claude"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "differs from this package's copy (1 changed, 0 missing, 0 extra file(s))" in line and "--force" in line
    assert "my note" in (dest / "SKILL.md").read_text(encoding="utf-8")
    assert inst.uninstall_main(["--target", "claude", "--force"]) == 0
    assert list(project.iterdir()) == []


def test_a_relative_path_is_from_the_current_directory_and_not_with_user_scope(project, home, capsys):
    """`install --target ./x --scope user` went to ~/x without a word: a relative PATH is taken from
    the current directory, so --scope user with one is a usage error naming ~/x."""
    assert inst.main(["--target", "./x", "--scope", "user"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--scope user with the relative path ./x" in line and "~/x" in line
    assert list(home.iterdir()) == [] and list(project.iterdir()) == []
    assert inst.main(["--target", "./x", "--scope", "project"]) == 0 and (project / "x" / NAME).is_dir()
    assert inst.main(["--target", "~/x", "--scope", "user"]) == 0 and (home / "x" / NAME).is_dir()
    capsys.readouterr()
    assert inst.list_main(["--target", "./x"]) == 0  # one place, not one per scope
    assert capsys.readouterr().out.split() == ["up-to-date", "./x", "project", str(project / "x" / NAME)]


def test_list_and_install_agree_on_a_symlinked_identical_copy(project, tmp_path, capsys):
    """A skills folder whose palm-rlhf-pytorch entry links to an identical copy: `list` said
    up-to-date while install refused it as a different copy (0 changed, 0 missing, 0 extra)."""
    assert inst.main(["--target", str(tmp_path / "real")]) == 0
    (project / "skills").mkdir()
    (project / "skills" / NAME).symlink_to(tmp_path / "real" / NAME)
    capsys.readouterr()
    assert inst.list_main(["--target", "./skills"]) == 0
    assert capsys.readouterr().out.split()[0] == "up-to-date"
    assert inst.main(["--target", "./skills"]) == 0
    assert "already up to date" in capsys.readouterr().out
    assert inst.uninstall_main(["--target", "./skills"]) == 0  # removes the link, not what it points to
    assert not (project / "skills" / NAME).is_symlink() and (tmp_path / "real" / NAME / "SKILL.md").is_file()


def test_list_reports_each_location(project, home, capsys):
    assert inst.main(["--target", "claude"]) == 0
    assert inst.main(["--target", "agents", "--scope", "user"]) == 0
    (home / ".agents/skills" / NAME / "LICENSE").unlink()
    capsys.readouterr()
    assert inst.list_main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["skill"] == NAME and report["files"] == len(repo_tree())
    statuses = {(r["target"], r["scope"]): r["status"] for r in report["locations"]}
    assert statuses == {("claude", "project"): "up-to-date", ("claude", "user"): "absent",
                        ("agents", "project"): "absent", ("agents", "user"): "different"}
    assert_keys_documented("## list report", [report])  # references/tool-reports.md
    paths = {(r["target"], r["scope"]): r["path"] for r in report["locations"]}
    assert paths[("claude", "user")] == str(home / ".claude/skills" / NAME)

    assert inst.list_main(["--target", "./nowhere", "--scope", "project"]) == 0
    assert capsys.readouterr().out.split() == ["absent", "./nowhere", "project", str(project / "nowhere" / NAME)]


def test_console_script_install_then_copy_runs_without_this_package(empty_dir, home):
    """The installed copy is self-sufficient: its smoke helper runs by path with the import of
    palm_rlhf_skill blocked (sys.modules entry None), outside the repository, in isolated mode."""
    proc = run([str(BIN / "palm-rlhf-skill"), "install", "--target", "claude", "--scope", "project"],
               empty_dir, env={"HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    dest = empty_dir / ".claude" / "skills" / NAME
    assert files_with_hashes(dest) == repo_tree()
    assert skills_ref.validate(dest) == []

    script = dest / SMOKE_IN_COPY
    probe = (
        "import runpy, sys\n"
        "sys.modules['palm_rlhf_skill'] = None  # any import of the package now fails\n"
        f"sys.argv = [{str(script)!r}, '--construct-only', '--json', '--device', 'cpu']\n"
        "try:\n"
        f"    runpy.run_path({str(script)!r}, run_name='__main__')\n"
        "finally:\n"
        "    sys.stderr.write('\\nRUNTIME ' + sys.modules['skill_runtime'].__file__ + '\\n')\n")
    proc, report = run_json([sys.executable, "-I", "-c", probe], empty_dir)
    assert proc.returncode == 0 and report["status"] == "ok", proc.stderr[-2000:]
    assert report["mode"] == "construct-only" and report["parameters"]["trainable_total"] > 0
    runtime = proc.stderr.strip().splitlines()[-1]
    assert runtime == f"RUNTIME {dest / 'scripts' / 'skill_runtime' / '__init__.py'}"  # the copy's, not the repo's
    assert sorted(p.name for p in empty_dir.iterdir()) == [".claude"]

    # the README's one exception: the copy's check_skill.py also needs skills-ref, and says so (exit 3)
    check = dest / "scripts" / "check_skill.py"
    probe = ("import runpy, sys\n"
             "sys.modules['palm_rlhf_skill'] = sys.modules['skills_ref'] = None\n"
             f"sys.argv = [{str(check)!r}]\n"
             f"runpy.run_path({str(check)!r}, run_name='__main__')\n")
    proc = run([sys.executable, "-I", "-c", probe], empty_dir)
    assert proc.returncode == 3 and "skills-ref is not installed: pip install 'skills-ref" in proc.stderr, proc.stderr[-2000:]
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert ("except `scripts/check_skill.py` (what `palm-rlhf-skill check` runs), which also needs `skills-ref` "
            "(without it: exit 3") in readme


@pytest.mark.parametrize("command", ["install", "uninstall", "list"])
def test_help_is_fast_and_does_not_import_torch(empty_dir, command):
    proc = run([str(BIN / "palm-rlhf-skill"), command, "--help"], empty_dir,
               env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0 and "exit codes:" in proc.stdout and "--target" in proc.stdout
    assert not any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def readme_install_block() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Install the skill for your agent", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_install_commands_do_what_their_comments_say(project, home, capsys):
    """Each README install line runs, and lands where its comment says (./ = project, ~/ = home)."""
    lines = readme_install_block()
    assert [line.split()[1] for line in lines] == ["install"] * 4 + ["list", "uninstall"]
    for line in lines:
        command, _, comment = line.partition("#")
        words = command.split()[1:]
        main = {"install": inst.main, "uninstall": inst.uninstall_main, "list": inst.list_main}[words[0]]
        assert main(words[1:]) == 0, (line, capsys.readouterr().err)
        where = re.search(r"(\./|~/)(\S+/)", comment)
        if words[0] == "install" and where:
            base = project if where.group(1) == "./" else home
            assert files_with_hashes(base / where.group(2) / NAME) == repo_tree(), line
    assert files_with_hashes(project / "path/to/skills" / NAME) == repo_tree()
    assert not (project / ".claude/skills" / NAME).exists()  # the uninstall line removed it
    smoke = re.search(r"`python (\S+tiny_rlhf_smoke\.py) --json`", (REPO / "README.md").read_text(encoding="utf-8"))
    assert smoke.group(1) == f".claude/skills/{NAME}/{SMOKE_IN_COPY}"
