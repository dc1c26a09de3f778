"""LocalizeParams validation: every decision parameter has a range, and a bad value names
its field."""

from __future__ import annotations

import pytest
from pulse.localization.params import LocalizeParams

from pulse.errors import ConfigError

BAD = [("ref_size", 0), ("rail_max_records", 0), ("rail_siblings_max", 0), ("rail_siblings_drop", 0),
       ("alive_max", 0), ("alive_drop", 0), ("waits_per_window", 0), ("job_waits_window", 0),
       ("ref_percentile", 101), ("ref_percentile_grouped", -1), ("clean_max_slow_frac", 1.5),
       ("late_min_fill", -0.1), ("act_top_frac", -0.01), ("stop_absent_majority", -1), ("conf_per_op", -0.1),
       ("conf_base", 0.0), ("conf_max", 1.5), ("rail_siblings_drop", 50_001), ("alive_drop", 513),
       ("rail_persist", 65), ("timing_persist_frac", 0.4), ("timing_persist_frac", 1.01), ("ceiling_ops", -1)]


def test_defaults_are_valid():
    LocalizeParams()


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_bad_value_is_a_config_error_naming_the_field(name, value):
    with pytest.raises(ConfigError, match=name):
        LocalizeParams(**{name: value})


def test_conf_base_above_conf_max_is_refused():
    with pytest.raises(ConfigError, match="conf_base"):
        LocalizeParams(conf_base=0.9, conf_max=0.8)
