"""`autograd-guard report`: --json, --guard, --since, aligned columns, findings apart."""

from __future__ import annotations

import json

import pytest

from autograd_guard import cli


def record(guard, action, callsite, timestamp, process="1-a", event="it happened"):
    return {
        "event": event,
        "guard": guard,
        "action": action,
        "callsite": callsite,
        "process": process,
        "timestamp": timestamp,
    }


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "events.jsonl"
    records = [
        record("grad_mode", "enable_grad", "train.py:12", "2025-01-31T10:00:00.000001Z"),
        record("grad_health", "lost_gradient", "train.py:40", "2025-01-31T11:00:00.000000Z"),
        record("snapshot_inputs", "snapshot", "kernels.py:7", "2025-01-31T12:30:00.000000Z"),
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def report(capsys, *args):
    assert cli.main(["report", *args]) == 0
    return capsys.readouterr().out


def test_columns_are_aligned_and_findings_counted_apart(log, capsys):
    assert report(capsys, str(log)).splitlines() == [
        "2 interventions at 2 call sites; 1 finding in 1 process",
        "guard            action         count  call site     event",
        "grad_health      lost_gradient      1  train.py:40   it happened",
        "grad_mode        enable_grad        1  train.py:12   it happened",
        "snapshot_inputs  snapshot           1  kernels.py:7  it happened",
    ]


def test_json_and_filters(log, capsys):
    out = report(capsys, str(log), "--json", "--guard", "grad_mode", "--guard", "grad_health")
    data = json.loads(out)
    assert data["summary"] == "1 intervention at 1 call site; 1 finding"
    assert [(r["guard"], r["kind"], r["count"]) for r in data["rows"]] == [
        ("grad_health", "finding", 1),
        ("grad_mode", "intervention", 1),
    ]
    since = json.loads(report(capsys, str(log), "--json", "--since", "2025-01-31T11:00:00"))
    assert [r["guard"] for r in since["rows"]] == ["grad_health", "snapshot_inputs"]
    later = report(capsys, str(log), "--since", "2025-01-31T13:30:00+02:00")
    assert later.splitlines()[0] == "1 intervention at 1 call site in 1 process"


def test_a_bad_since_is_named(log, capsys):
    with pytest.raises(SystemExit):
        cli.main(["report", str(log), "--since", "yesterday"])
    assert "'yesterday' is not an ISO 8601 time" in capsys.readouterr().err


def test_guard_names_are_read_in_any_case(log, capsys):
    """As in the policy and the variables: GRAD_HEALTH is grad_health."""
    data = json.loads(report(capsys, str(log), "--json", "--guard", "GRAD_HEALTH"))
    assert [(r["guard"], r["action"]) for r in data["rows"]] == [("grad_health", "lost_gradient")]
    assert cli.main(["report", str(log), "--guard", "Grad_Helth"]) == 2
    assert "did you mean 'grad_health'?" in capsys.readouterr().err


def test_call_sites_sort_by_line_number_and_kinds_tell_notes_from_errors(tmp_path, capsys):
    """train.py:2 comes before train.py:10 (not as strings); a note is no error."""
    path = tmp_path / "events.jsonl"
    records = [
        record("grad_mode", "enable_grad", f"train.py:{line}", "2025-01-31T10:00:00Z")
        for line in (10, 2, 100, 9)
    ]
    records.append(record("grad_health", "steps_skipped", "train.py:5", "2025-01-31T10:00:00Z"))
    records.append(
        record("gsplat_means2d", "guard_error", "check:KeyError", "2025-01-31T10:00:00Z")
    )
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    lines = report(capsys, str(path)).splitlines()
    assert lines[0] == "4 interventions at 4 call sites; 1 note; 1 guard error in 1 process"
    sites = [line.split()[3] for line in lines[2:] if line.startswith("grad_mode")]
    assert sites == ["train.py:2", "train.py:9", "train.py:10", "train.py:100"]
    data = json.loads(report(capsys, str(path), "--json"))
    kinds = {r["action"]: r["kind"] for r in data["rows"]}
    assert kinds == {"enable_grad": "intervention", "steps_skipped": "note", "guard_error": "error"}
