"""`ServerMetrics.render`: the engine's speculative-decoding stats reach `/metrics`."""

from moe.serve.metrics import ServerMetrics


def test_speculative_stats_are_rendered():
    stats = {"spec_steps": 4, "spec_proposed": 12, "spec_accepted": 9, "spec_emitted": 13,
             "spec_acceptance_rate": 0.75, "spec_mean_accepted_length": 2.25}
    text = ServerMetrics().render(stats, 0)
    for line in ["moe_serve_spec_proposed_total 12", "moe_serve_spec_accepted_total 9", "moe_serve_spec_steps_total 4",
                 "moe_serve_spec_acceptance_rate 0.75", "moe_serve_spec_mean_accepted_length 2.25",
                 "# TYPE moe_serve_spec_accepted_total counter", "# TYPE moe_serve_spec_acceptance_rate gauge"]:
        assert line in text.splitlines(), line
    assert "spec_" not in ServerMetrics().render({}, 0)  # an engine without the keys: nothing rendered
