"""client.cluster.extension_keys: advertised keys first, configured fallbacks second."""

from __future__ import annotations

from client.cluster import DESCRIBE_IN_FLIGHT_FEATURE, MARK_IN_PROGRESS_FEATURE, extension_keys

APIS = {76: (1, 1), 78: (1, 2), 81: (0, 0), 82: (0, 0), 1081: (0, 0)}


def test_advertised_features_win_over_the_configuration():
    keys = extension_keys(APIS, {MARK_IN_PROGRESS_FEATURE: (1081, 1081), DESCRIBE_IN_FLIGHT_FEATURE: (82, 82)}, 81, 82)
    assert (keys.mark_in_progress, keys.describe_in_flight, keys.advertised) == (1081, 82, True)
    assert keys.mark_in_progress_served and keys.describe_in_flight_served


def test_without_features_the_configured_keys_are_used_and_checked_in_api_keys():
    keys = extension_keys({81: (0, 0)}, {}, 81, 82)
    assert (keys.mark_in_progress, keys.describe_in_flight, keys.advertised) == (81, 82, False)
    assert keys.mark_in_progress_served and not keys.describe_in_flight_served


def test_an_odd_feature_range_is_not_taken_as_a_key():
    keys = extension_keys(APIS, {MARK_IN_PROGRESS_FEATURE: (0, 5)}, 81, 82)
    assert keys.mark_in_progress == 81


def test_unrelated_features_are_ignored():
    keys = extension_keys(APIS, {"metadata.version": (1, 27)}, 81, 82)
    assert (keys.mark_in_progress, keys.describe_in_flight, keys.advertised) == (81, 82, False)
