"""The lab's state (lab.containerlab.state): it belongs to the lab's name, not to the folder an
inventory is in; nothing planted in it is followed or trusted (a symlink at each place, another
owner, a mode that lets others in, a wheel the lab did not download); the SSH key is only ever a
new file of mode 0600; two commands never change one lab at once."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lab.containerlab import image, sshd, state
from lab.containerlab.topology import LabPaths
from lab.errors import ExitCode

from .conftest import REPO


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(state.STATE_VAR, str(tmp_path / "state"))
    return tmp_path / "state"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_two_inventories_in_one_folder_are_two_labs_states(home: Path) -> None:
    a, b = LabPaths(Path("/tmp/a.yaml"), "class-a"), LabPaths(Path("/tmp/b.yaml"), "class-b")
    assert a.own == home / "labs" / "class-a" and b.own == home / "labs" / "class-b"
    assert LabPaths(Path("/elsewhere/a.yaml"), "class-a").key == a.key  # the name's, wherever the inventory


def test_the_key_is_made_new_0600_in_folders_of_0700(home: Path) -> None:
    key = sshd.ensure_key(state.lab_dir("lab") / "ssh" / "id_ed25519", lambda _: None)
    assert mode(key) == 0o600 and key.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY")
    assert [mode(p) for p in (home, home / "labs", home / "labs" / "lab", key.parent)] == [0o700] * 4
    before = key.read_bytes()
    key.with_suffix(".pub").unlink()
    assert sshd.ensure_key(key, lambda _: None) == key and key.read_bytes() == before  # kept; its .pub derived again
    assert key.with_suffix(".pub").read_bytes().startswith(b"ssh-ed25519 ")
    assert mode(key.with_suffix(".pub")) == 0o644  # (public: the hosts' sshd reads it as the lab's user)


@pytest.mark.parametrize("planted", ["labs", "labs/lab", "labs/lab/ssh", "labs/lab/ssh/id_ed25519"])
def test_a_symlink_planted_at_any_place_of_the_state_is_refused_and_nothing_is_written_through_it(
        home: Path, tmp_path: Path, planted: str) -> None:
    target = tmp_path / "victim"
    target.mkdir()
    place = home / planted
    state.ensure_dir(place.parent)
    os.symlink(target if planted != "labs/lab/ssh/id_ed25519" else target / "file", place)
    with pytest.raises(state.StateError, match=f"^the lab's .*{planted} is a symlink, not a"):
        sshd.ensure_key(home / "labs" / "lab" / "ssh" / "id_ed25519", lambda _: None)
    assert list(target.iterdir()) == []  # nothing went where it points


def test_a_state_folder_others_may_enter_or_a_readable_key_is_refused_with_the_fix(home: Path) -> None:
    key = sshd.ensure_key(state.lab_dir("lab") / "ssh" / "id_ed25519", lambda _: None)
    key.chmod(0o644)
    with pytest.raises(state.StateError, match=rf"^the lab's file {key} has mode 0644: others may reach it "
                                               rf"\(chmod go= {key}\)$"):
        sshd.ensure_key(key, lambda _: None)
    key.chmod(0o600)
    (home / "labs").chmod(0o755)
    with pytest.raises(state.StateError, match="has mode 0755"):
        sshd.ensure_key(key, lambda _: None)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's takes root")
def test_a_state_folder_of_another_user_is_refused(home: Path) -> None:
    folder = state.ensure_dir(state.lab_dir("lab"))
    os.chown(folder, 65534, 65534)
    with pytest.raises(state.StateError, match=r"belongs to uid 65534, not to you \(uid 0\): remove it"):
        sshd.ensure_key(folder / "ssh" / "id_ed25519", lambda _: None)


def test_the_key_is_never_written_over_a_file_in_its_place(home: Path) -> None:
    key = state.lab_dir("lab") / "ssh" / "id_ed25519"
    state.write(key, b"a file some run left")
    with pytest.raises(state.StateError, match="is there already"):
        state.write_new(key, b"secret")
    assert key.read_bytes() == b"a file some run left"


def test_a_file_is_written_whole_and_replaces_a_symlink_in_its_place_not_its_target(home: Path,
                                                                                    tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    known_hosts = state.ensure_dir(state.lab_dir("lab")) / "known_hosts"
    os.symlink(victim, known_hosts)
    state.write(known_hosts, b"node1 ssh-ed25519 AAAA\n")
    assert victim.read_text() == "untouched" and not known_hosts.is_symlink() and mode(known_hosts) == 0o600
    assert sorted(p.name for p in known_hosts.parent.iterdir()) == ["known_hosts"]  # no temporary file left


def test_a_wheel_the_lab_did_not_download_or_one_that_changed_is_refused(home: Path) -> None:
    wheels = state.ensure_dir(home / "wheels")
    good = wheels / "numpy-2.0-cp311.whl"
    good.write_bytes(b"numpy")
    good.chmod(0o600)
    (wheels / image.SUMS).write_text(f"{image._sha256(good)}  {good.name}\n")
    (wheels / image.SUMS).chmod(0o600)
    assert image.ensure_wheelhouse(wheels, print) == {good: image._sha256(good)}
    planted = wheels / "torch-9.9-cp311.whl"
    planted.write_bytes(b"anything, run as root in the image")
    planted.chmod(0o600)
    with pytest.raises(state.StateError, match=rf"^{planted} is not a wheel the lab downloaded \(SHA256SUMS does "
                                               "not list it\\)$"):
        image.ensure_wheelhouse(wheels, print)
    planted.unlink()
    good.write_bytes(b"numpy, changed")
    with pytest.raises(state.StateError, match="changed since the lab downloaded it"):
        image.ensure_wheelhouse(wheels, print)


def test_the_image_tag_follows_a_wheels_content_not_its_size(tmp_path: Path) -> None:
    a, b = tmp_path / "a.whl", tmp_path / "b.whl"
    a.write_bytes(b"same size 1")
    b.write_bytes(b"same size 2")
    files = {"Dockerfile": a}
    assert image._digest("base", {"wheels/x.whl": a, **files}, {}) != image._digest("base", {"wheels/x.whl": b,
                                                                                             **files}, {})


def test_two_commands_never_change_one_lab_at_once(home: Path) -> None:
    with state.locked("class", "up"):
        busy = rf"^lab class is being changed by another lab command \(pid {os.getpid()}, up\): wait for it to end$"
        with pytest.raises(state.StateError, match=busy), state.locked("class", "down"):
            pass
        with state.locked("other", "up"):  # another lab's is its own
            pass
    with state.locked("class", "down"):  # let go of with the first
        pass


def test_a_second_up_of_a_lab_being_brought_up_is_one_line_and_exit_2(home: Path) -> None:
    """The real command, while a lab command holds the lab: it stops before it touches anything
    (no engine is asked), in one line."""
    env = {**os.environ, state.STATE_VAR: str(home)}
    with state.locked("busy", "up"):
        done = subprocess.run([sys.executable, "-m", "lab", "up", "--name", "busy"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
        downed = subprocess.run([sys.executable, "-m", "lab", "down", "--name", "busy"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=60)
    for result in (done, downed):
        assert result.returncode == ExitCode.BAD_INPUT, result.stderr
        assert result.stderr.splitlines() == [f"lab: error: lab busy is being changed by another lab command "
                                              f"(pid {os.getpid()}, up): wait for it to end"]


def test_a_planted_state_is_one_line_and_exit_2_from_the_command(home: Path, tmp_path: Path) -> None:
    state.ensure_dir(home / "labs")
    os.symlink(tmp_path, home / "labs" / "planted")
    done = subprocess.run([sys.executable, "-m", "lab", "down", "--name", "planted"], cwd=REPO,
                          env={**os.environ, state.STATE_VAR: str(home)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert done.stderr.splitlines() == [f"lab: error: the lab's state directory {home}/labs/planted is a symlink, "
                                        "not a directory: remove it"]
