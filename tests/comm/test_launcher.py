"""``fusionc launch`` and process groups, on the CPU: torchrun's variables, multicast off, the
object exchange between ranks, a failing rank stopping the others, and clear errors for a bad
environment."""
import os
import subprocess
import sys

import pytest

from fusionc.comm.group import Group
from fusionc.comm.launcher import SAFE_ENV, launch, rank_env
from fusionc.errors import InputError


def _fusionc(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "fusionc", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_rank_environment():
    env = rank_env(1, 2, 29500, base={})
    assert env["RANK"] == env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["MASTER_PORT"] == "29500"
    for k, v in SAFE_ENV.items():
        assert env[k] == v
    assert SAFE_ENV["NCCL_NVLS_ENABLE"] == "0"


def test_ranks_exchange_objects():
    code = ("from fusionc.comm.group import Group; g = Group.from_env(); "
            "print('got', g.all_gather((g.rank, 'x' * g.rank))); g.barrier(); g.close()")
    p = _fusionc("launch", "-n", "3", "--", sys.executable, "-c", code)
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(3):
        assert f"[rank {r}] got [(0, ''), (1, 'x'), (2, 'xx')]" in p.stdout


def test_a_failing_rank_stops_the_others():
    code = ("import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(7)\n"
            "time.sleep(60)")
    p = _fusionc("launch", "-n", "2", "--", sys.executable, "-c", code, timeout=30)
    assert p.returncode == 7


def test_no_command_is_an_error():
    with pytest.raises(InputError, match="no command"):
        launch([], 2)
    p = _fusionc("launch", "-n", "2")
    assert p.returncode == 1 and "fusionc: " in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("env,match", [
    ({"WORLD_SIZE": "two"}, "not an integer"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK < WORLD_SIZE"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_PORT"),
])
def test_bad_environment(monkeypatch, env, match):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "FUSIONC_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(InputError, match=match):
        Group.from_env()


def test_a_single_process_group_needs_no_connection(monkeypatch):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    g = Group.from_env()
    assert (g.rank, g.world) == (0, 1) and g.all_gather("a") == ["a"]
    assert os.environ.get("WORLD_SIZE") is None


def test_bad_ports_and_counts_are_refused():
    with pytest.raises(InputError, match="port"):
        launch([sys.executable, "-c", "pass"], 2, port=65535)
    with pytest.raises(InputError, match="processes"):
        launch([sys.executable, "-c", "pass"], 0)


def test_a_missing_program_is_an_error():
    with pytest.raises(InputError, match="cannot start"):
        launch(["/nonexistent/program"], 2)


def test_undecodable_output_does_not_stall_the_ranks():
    code = ("import sys; sys.stdout.buffer.write(b'\\xff\\n'); sys.stdout.flush(); "
            "[print(i) for i in range(20000)]")
    p = _fusionc("launch", "-n", "2", "--", sys.executable, "-c", code, timeout=60)
    assert p.returncode == 0 and "[rank 1] 19999" in p.stdout


def test_a_rank_killed_by_a_signal_is_named():
    code = "import os, signal\nif os.environ['RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)"
    p = _fusionc("launch", "-n", "2", "--", sys.executable, "-c", code)
    assert p.returncode == 128 + 9 and "rank 1 was killed by signal 9" in p.stderr


def test_rank_zero_does_not_wait_forever(monkeypatch):
    from fusionc.comm import group as gm
    from fusionc.errors import DeviceError
    monkeypatch.setattr(gm, "_GROUPS", {})
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DeviceError, match=r"ranks \[\] connected within 1 s"):
        Group.from_env(timeout=1)


def test_ranks_must_agree_on_the_world_size():
    code = ("import os\nfrom fusionc.comm.group import Group\n"
            "if os.environ['RANK'] == '1': os.environ['WORLD_SIZE'] = '3'\n"
            "Group.from_env(timeout=20)")
    p = _fusionc("launch", "-n", "2", "--", sys.executable, "-c", code)
    assert p.returncode != 0 and "WORLD_SIZE=3" in p.stdout


def _free_port():
    from fusionc.comm.launcher import free_port
    return free_port()
