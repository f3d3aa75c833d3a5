"""Live metrics from events and the step counter, read back with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from launcher.observability.metrics import RunMetrics


def samples(metrics: RunMetrics) -> dict[tuple[str, tuple], float]:
    text = metrics.text().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_events_and_steps_become_metrics():
    now = [100.0]
    m = RunMetrics(clock=lambda: now[0])
    for record in [
        {"event": "generation", "generation": 1, "world_size": 4},
        {"event": "fault", "kind": "node"},
        {"event": "fault", "kind": "kill"},
        {"event": "recovered", "seconds": 0.6, "steps_lost": 1},
        {"event": "generation", "generation": 2, "world_size": 3},
        {"event": "resize", "why": "fault", "seconds": 1.5},
        {"event": "checkpoint-saved", "tier": "persistent", "seconds": 0.2},
        {"event": "requeue", "cause": "preemption"},
        {"event": "protection", "step": 16, "every": 16, "steps_at_risk": 17},
    ]:
        m.on_event(record)
    for step in (10, 15, 30):
        m.on_step(step)
        now[0] += 5.0
    s = samples(m)
    assert s[("sres_step", ())] == 30 and s[("sres_steps_per_second", ())] == 2.0  # 20 steps in 10 s
    assert (s[("sres_world_size", ())], s[("sres_generation", ())], s[("sres_running", ())]) == (3, 2, 1)
    assert (
        s[("sres_faults_total", (("kind", "node"),))] == 1
        and s[("sres_faults_total", (("kind", "kill"),))] == 1
    )
    assert s[("sres_recovery_seconds_count", ())] == 1 and s[("sres_recovery_seconds_sum", ())] == 0.6
    assert s[("sres_recovery_seconds_bucket", (("le", "1.0"),))] == 1
    assert s[("sres_steps_redone_total", ())] == 1
    assert s[("sres_resize_seconds_count", (("why", "fault"),))] == 1
    assert s[("sres_tier_save_seconds_count", (("tier", "persistent"),))] == 1
    assert s[("sres_requeues_total", (("cause", "preemption"),))] == 1
    assert (s[("sres_protection_every", ())], s[("sres_steps_at_risk", ())]) == (16, 17)
    m.on_event(
        {"event": "finished", "goodput": 0.97, "goodput_by_cause": {"productive": 9.7, "startup": 0.3}}
    )
    s = samples(m)
    assert (s[("sres_running", ())], s[("sres_goodput_ratio", ())]) == (0, 0.97)
    assert s[("sres_goodput_seconds", (("cause", "productive"),))] == 9.7


def test_the_rate_window_forgets_old_steps():
    now = [0.0]
    m = RunMetrics(clock=lambda: now[0])
    m.on_step(0)
    now[0] = 100.0
    m.on_step(50)  # the first sample is older than the window: no rate from one sample
    now[0] = 102.0
    m.on_step(54)
    assert samples(m)[("sres_steps_per_second", ())] == 2.0


def test_straggler_scores_and_events():
    m = RunMetrics()
    m.on_scores({0: 1.0, 2: 3.04})
    m.on_event({"event": "straggler", "rank": 2, "score": 3.0})
    s = samples(m)
    assert s[("sres_straggler_score", (("rank", "2"),))] == 3.04 and s[("sres_stragglers_total", ())] == 1


def test_commit_blocking_per_rank_step_is_a_histogram():
    """What protection costs training, live: most commits wait for nothing (the 0 bucket)."""
    m = RunMetrics()
    m.on_step_records([0.0, 0.0, 0.0, 0.2])
    s = samples(m)
    assert s[("sres_commit_blocked_seconds_count", ())] == 4
    assert s[("sres_commit_blocked_seconds_bucket", (("le", "0.0"),))] == 3
    assert s[("sres_commit_blocked_seconds_sum", ())] == 0.2
