import argparse

import pytest

from proxy.config import OPTIONS, HostPort, configure_parser, load_config, parse_host_port
from proxy.errors import ConfigError


def parse(argv, environ=None):
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return load_config(parser.parse_args(argv), environ=environ or {})


def test_flags_win_over_environment_which_wins_over_the_file(tmp_path):
    config_file = tmp_path / "proxy.toml"
    config_file.write_text('upstream = "file:1"\nmax-frame-size = 10\nshutdown_grace = 1.5\nlog_level = "debug"\n')
    config = parse(
        ["--config", str(config_file), "--max-frame-size", "30"],
        environ={"KSP_MAX_FRAME_SIZE": "20", "KSP_UPSTREAM": "env:2,env:3"},
    )
    assert config.max_frame_size == 30
    assert config.upstream == (HostPort("env", 2), HostPort("env", 3))
    assert config.shutdown_grace == 1.5
    assert config.log_level == "debug"


def test_config_file_from_environment(tmp_path):
    config_file = tmp_path / "proxy.toml"
    config_file.write_text('upstream = ["a:1", "b:2"]\nlog_json = true\n')
    config = parse([], environ={"KSP_CONFIG": str(config_file)})
    assert config.upstream == (HostPort("a", 1), HostPort("b", 2))
    assert config.log_json is True


def test_several_config_files_layer_in_order_later_files_win(tmp_path):
    image_defaults = tmp_path / "defaults.toml"
    image_defaults.write_text('listen = "0.0.0.0:9092"\nmetrics-port = 9404\nlog-json = true\n')
    mounted = tmp_path / "proxy.toml"
    mounted.write_text('upstream = "kafka:9092"\nmetrics-port = 9500\n')
    config = parse([], environ={"KSP_CONFIG": f"{image_defaults}, {mounted}"})
    assert config.listen == HostPort("0.0.0.0", 9092)  # only the defaults file sets it
    assert config.metrics_port == 9500  # the later file wins
    assert config.log_json is True
    assert config.upstream == (HostPort("kafka", 9092),)
    # The environment still overrides every file.
    assert parse([], environ={"KSP_CONFIG": f"{image_defaults},{mounted}", "KSP_METRICS_PORT": "1"}).metrics_port == 1


def test_a_missing_or_invalid_layer_names_its_file(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('upstream = "kafka:9092"\n')
    with pytest.raises(ConfigError, match="missing.toml"):
        parse(["--config", f"{good},{tmp_path / 'missing.toml'}"])
    bad = tmp_path / "bad.toml"
    bad.write_text("listen = \n")
    with pytest.raises(ConfigError, match="bad.toml"):
        parse(["--config", f"{bad},{good}"])


def test_metrics_host_defaults_to_the_listen_host_and_can_differ():
    assert parse(["--upstream", "k:1", "--listen", "127.0.0.1:9092"]).metrics_host is None
    config = parse(["--upstream", "k:1", "--listen", "127.0.0.1:9092"], environ={"KSP_METRICS_HOST": "0.0.0.0"})
    assert (config.listen.host, config.metrics_host) == ("127.0.0.1", "0.0.0.0")


def test_defaults():
    config = parse(["--upstream", "kafka:9092"])
    assert config.listen == HostPort("127.0.0.1", 9092)
    assert config.effective_advertised_host == "127.0.0.1"
    assert config.effective_broker_port_base == 9093
    assert config.max_frame_size == 100 * 1024 * 1024


def test_state_topic_replication_is_chosen_at_creation_unless_configured():
    default = parse(["--upstream", "k:1"])
    assert (default.state_topic_replication_factor, default.state_topic_min_insync_replicas) == (None, None)
    given = parse(["--upstream", "k:1", "--state-topic-replication-factor", "2"],
                  environ={"KSP_STATE_TOPIC_MIN_INSYNC_REPLICAS": "1"})
    assert (given.state_topic_replication_factor, given.state_topic_min_insync_replicas) == (2, 1)


def test_listen_port_zero_means_free_broker_ports_unless_a_base_is_given():
    assert parse(["--upstream", "k:1", "--listen", "127.0.0.1:0"]).effective_broker_port_base is None
    config = parse(["--upstream", "k:1", "--listen", "127.0.0.1:0", "--broker-port-base", "40000"])
    assert config.effective_broker_port_base == 40000


def test_switch_flag_and_boolean_environment():
    assert parse(["--upstream", "k:1", "--log-json"]).log_json is True
    assert parse(["--upstream", "k:1"], environ={"KSP_LOG_JSON": "yes"}).log_json is True
    assert parse(["--upstream", "k:1"], environ={"KSP_LOG_JSON": "0"}).log_json is False


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        ([], {}),  # upstream missing
        (["--upstream", "nohost"], {}),
        (["--upstream", "k:99999"], {}),
        (["--upstream", "k:1", "--max-frame-size", "many"], {}),
        (["--upstream", "k:1", "--max-in-flight", "0"], {}),
        (["--upstream", "k:1", "--log-level", "loud"], {}),
        (["--upstream", "k:1"], {"KSP_LOG_JSON": "maybe"}),
        (["--upstream", "k:1", "--config", "/nonexistent.toml"], {}),
        (["--upstream", "k:1", "--state-topic-replication-factor", "0"], {}),
        (["--upstream", "k:1", "--state-topic-min-insync-replicas", "0"], {}),
        (["--upstream", "k:1", "--state-topic-partitions", "0"], {}),
        (["--upstream", "k:1", "--heap-retain-bytes", "-1"], {}),
        (["--upstream", "k:1", "--malloc-arenas", "-1"], {}),
        (["--upstream", "k:1", "--state-linger-ms", "-1"], {}),
        (["--upstream", "k:1", "--state-writes-in-flight", "0"], {}),
        (["--upstream", "k:1", "--state-producers", "0"], {}),
    ],
)
def test_invalid_configuration_is_a_config_error(argv, environ):
    with pytest.raises(ConfigError):
        parse(argv, environ)


def test_unknown_config_file_keys_are_rejected(tmp_path):
    config_file = tmp_path / "proxy.toml"
    config_file.write_text('upstream = "k:1"\nmax_frame_sise = 3\n')
    with pytest.raises(ConfigError, match="max_frame_sise"):
        parse(["--config", str(config_file)])


def test_ipv6_literal():
    assert parse_host_port("[::1]:9092") == HostPort("::1", 9092)
    assert str(HostPort("::1", 9092)) == "[::1]:9092"


def test_help_names_every_flag_and_environment_variable():
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    text = parser.format_help()
    for option in OPTIONS:
        assert option.flag in text
        assert option.env in text


def test_connection_byte_budget_from_flag_environment_and_file(tmp_path):
    assert parse(["--upstream", "k:1"]).max_connection_bytes == 16 * 1024 * 1024
    assert parse(["--upstream", "k:1", "--max-connection-bytes", "1000"]).max_connection_bytes == 1000
    assert parse(["--upstream", "k:1"], environ={"KSP_MAX_CONNECTION_BYTES": "2000"}).max_connection_bytes == 2000
    config_file = tmp_path / "proxy.toml"
    config_file.write_text('upstream = "k:1"\nmax-connection-bytes = 3000\n')
    assert parse(["--config", str(config_file)]).max_connection_bytes == 3000
    with pytest.raises(ConfigError):
        parse(["--upstream", "k:1", "--max-connection-bytes", "0"])


def test_malloc_arenas_defaults_to_two_and_zero_leaves_glibcs_default():
    assert parse(["--upstream", "k:1"]).malloc_arenas == 2
    assert parse(["--upstream", "k:1", "--malloc-arenas", "0"]).malloc_arenas == 0
    assert parse(["--upstream", "k:1"], environ={"KSP_MALLOC_ARENAS": "4"}).malloc_arenas == 4


def test_heap_retain_bytes_defaults_to_128_mib_and_zero_turns_it_off():
    assert parse(["--upstream", "k:1"]).heap_retain_bytes == 128 * 1024 * 1024
    assert parse(["--upstream", "k:1", "--heap-retain-bytes", "0"]).heap_retain_bytes == 0
    assert parse(["--upstream", "k:1"], environ={"KSP_HEAP_RETAIN_BYTES": "1048576"}).heap_retain_bytes == 1048576


def test_cut_through_is_on_by_default_only_where_responses_can_be_spliced():
    plain = parse(["--upstream", "k:1"])
    assert plain.stream_responses_from is None and plain.effective_stream_responses_from == 128 * 1024
    tls_listeners = load_config({"upstream": "k:1", "listener_ssl_certificate_location": "c.pem",
                                 "listener_ssl_key_location": "k.pem"}, environ={})
    assert tls_listeners.effective_stream_responses_from == 0
    tls_upstream = load_config({"upstream": "k:1", "upstream_security_protocol": "SSL"}, environ={})
    assert tls_upstream.effective_stream_responses_from == 0
    # An explicit value applies everywhere, 0 included.
    assert parse(["--upstream", "k:1", "--stream-responses-from", "0"]).effective_stream_responses_from == 0
    assert load_config({"upstream": "k:1", "upstream_security_protocol": "SSL", "stream_responses_from": 65536},
                       environ={}).effective_stream_responses_from == 65536
    with pytest.raises(ConfigError, match="stream_responses_from"):
        parse(["--upstream", "k:1", "--stream-responses-from", "-1"])


def test_request_cut_through_is_on_by_default_and_never_with_tls():
    plain = parse(["--upstream", "k:1"])
    assert plain.stream_requests_from is None and plain.effective_stream_requests_from == 128 * 1024
    assert parse(["--upstream", "k:1", "--stream-requests-from", "0"]).effective_stream_requests_from == 0
    assert parse(["--upstream", "k:1"], environ={"KSP_STREAM_REQUESTS_FROM": "262144"}
                 ).effective_stream_requests_from == 262144
    # Requests are only ever spliced: with TLS on either side there is nothing to gain, even if set.
    tls_upstream = load_config({"upstream": "k:1", "upstream_security_protocol": "SSL",
                                "stream_requests_from": 65536}, environ={})
    assert tls_upstream.effective_stream_requests_from == 0
    tls_listeners = load_config({"upstream": "k:1", "listener_ssl_certificate_location": "c.pem",
                                 "listener_ssl_key_location": "k.pem"}, environ={})
    assert tls_listeners.effective_stream_requests_from == 0
    with pytest.raises(ConfigError, match="stream_requests_from"):
        parse(["--upstream", "k:1", "--stream-requests-from", "-1"])


def test_gc_threshold_defaults_to_10000_and_zero_keeps_cpythons_defaults():
    assert parse(["--upstream", "k:1"]).gc_threshold == 10_000
    assert parse(["--upstream", "k:1", "--gc-threshold", "0"]).gc_threshold == 0
    assert parse(["--upstream", "k:1"], environ={"KSP_GC_THRESHOLD": "5000"}).gc_threshold == 5000
    with pytest.raises(ConfigError, match="gc_threshold"):
        parse(["--upstream", "k:1", "--gc-threshold", "-1"])


def test_max_connections_option():
    assert parse(["--upstream", "k:1"]).max_connections == 1000
    assert parse(["--upstream", "k:1"], environ={"KSP_MAX_CONNECTIONS": "7"}).max_connections == 7
    with pytest.raises(ConfigError):
        parse(["--upstream", "k:1", "--max-connections", "-1"])


def test_share_session_partition_bounds_reach_the_share_settings():
    from proxy.serve import share_settings

    config = parse(["--upstream", "k:1", "--max-share-session-partitions", "5"],
                   environ={"KSP_MAX_SHARE_SESSION_PARTITIONS_TOTAL": "50"})
    settings = share_settings(config)
    assert (settings.max_share_session_partitions, settings.max_share_session_partitions_total) == (5, 50)
    defaults = share_settings(parse(["--upstream", "k:1"]))
    assert (defaults.max_share_session_partitions, defaults.max_share_session_partitions_total) == (10_000, 200_000)


def test_share_connection_pools_reach_the_share_settings():
    from proxy.serve import share_settings

    settings = share_settings(parse(["--upstream", "k:1", "--share-long-poll-connections", "2"],
                                    environ={"KSP_SHARE_UPSTREAM_CONNECTIONS": "5"}))
    assert (settings.upstream_connections, settings.long_poll_connections) == (5, 2)
    defaults = share_settings(parse(["--upstream", "k:1"]))
    assert (defaults.upstream_connections, defaults.long_poll_connections) == (32, 8)
    with pytest.raises(ConfigError):
        parse(["--upstream", "k:1", "--share-long-poll-connections", "0"])


def test_state_writes_in_flight_reaches_the_share_settings():
    from proxy.serve import share_settings

    assert share_settings(parse(["--upstream", "k:1"])).state_writes_in_flight == 4
    assert share_settings(parse(["--upstream", "k:1", "--state-writes-in-flight", "1"])).state_writes_in_flight == 1
    assert share_settings(parse(["--upstream", "k:1"], environ={"KSP_STATE_WRITES_IN_FLIGHT": "8"})
                          ).state_writes_in_flight == 8


def test_state_producers_reach_the_share_settings():
    from proxy.serve import share_settings

    assert share_settings(parse(["--upstream", "k:1"])).state_producers == 4
    assert share_settings(parse(["--upstream", "k:1", "--state-producers", "3"])).state_producers == 3
    assert share_settings(parse(["--upstream", "k:1"], environ={"KSP_STATE_PRODUCERS": "2"})).state_producers == 2


def test_state_delta_flags_reach_the_share_settings():
    from proxy.serve import share_settings

    defaults = share_settings(parse(["--upstream", "k:1"]))
    assert (defaults.state_deltas, defaults.state_snapshot_every) == (True, 100)
    settings = share_settings(parse(["--upstream", "k:1", "--state-deltas", "OFF"],
                                    environ={"KSP_STATE_SNAPSHOT_EVERY": "7"}))
    assert (settings.state_deltas, settings.state_snapshot_every) == (False, 7)
    assert share_settings(parse(["--upstream", "k:1"], environ={"KSP_STATE_DELTAS": "off"})).state_deltas is False
    for flags in (["--state-deltas", "maybe"], ["--state-snapshot-every", "0"]):
        with pytest.raises(ConfigError):
            parse(["--upstream", "k:1", *flags])


def test_describe_in_flight_key_defaults_to_the_draft_kip_and_may_move_to_another_free_kafka_key():
    assert load_config({"upstream": "k:9092"}, environ={}).describe_in_flight_api_key == 82
    moved = load_config({"upstream": "k:9092"}, environ={"KSP_DESCRIBE_IN_FLIGHT_API_KEY": "80"})
    assert moved.describe_in_flight_api_key == 80


@pytest.mark.parametrize("key", ["3", "76", "10082", "-1"])
def test_describe_in_flight_key_must_be_a_free_flexible_kafka_key(key):
    # Metadata (3) is not flexible at v0; 76 is served as ShareGroupHeartbeat; 10082 is no Kafka key.
    with pytest.raises(ConfigError, match="describe_in_flight_api_key"):
        load_config({"upstream": "k:9092", "describe_in_flight_api_key": key}, environ={})


def test_mark_in_progress_key_defaults_to_the_draft_kip_and_must_differ_from_the_describe_key():
    assert load_config({"upstream": "k:9092"}, environ={}).mark_in_progress_api_key == 81
    moved = load_config({"upstream": "k:9092", "mark_in_progress_api_key": "80"}, environ={})
    assert (moved.mark_in_progress_api_key, moved.describe_in_flight_api_key) == (80, 82)
    with pytest.raises(ConfigError, match="both 82"):
        load_config({"upstream": "k:9092", "mark_in_progress_api_key": "82"}, environ={})
    with pytest.raises(ConfigError, match="mark_in_progress_api_key 90: the proxy already serves DescribeShareGroupOffsets"):
        load_config({"upstream": "k:9092", "mark_in_progress_api_key": "90"}, environ={})
    with pytest.raises(ConfigError, match="mark_in_progress_api_key 3 is not a Kafka API key flexible"):
        load_config({"upstream": "k:9092", "mark_in_progress_api_key": "3"}, environ={})


def test_in_progress_defaults_and_bounds_reach_the_share_settings():
    from proxy.serve import share_settings

    defaults = share_settings(parse(["--upstream", "k:1"]))
    group = defaults.coordinator_config().group_defaults
    assert (group.in_progress_staleness_threshold_ms, group.in_progress_max_lock_extension_ms,
            group.in_progress_rebalance_grace_ms) == (90_000, 1_800_000, 5_000)
    settings = share_settings(parse(["--upstream", "k:1", "--share-in-progress-staleness-threshold-ms", "2000",
                                     "--share-in-progress-max-lock-extension-ms", "6000",
                                     "--share-in-progress-rebalance-grace-ms", "700",
                                     "--share-max-in-progress-rebalance-grace-ms", "900"]))
    config = settings.coordinator_config()
    assert (config.group_defaults.in_progress_staleness_threshold_ms,
            config.group_defaults.in_progress_max_lock_extension_ms,
            config.group_defaults.in_progress_rebalance_grace_ms) == (2_000, 6_000, 700)
    assert (config.limits.min_in_progress_staleness_threshold_ms, config.limits.max_in_progress_rebalance_grace_ms) == (
        1_000, 900)
    # A proxy default outside the group bounds widens them, as for Kafka's own configs.
    wide = share_settings(parse(["--upstream", "k:1", "--share-in-progress-staleness-threshold-ms", "500"]))
    assert wide.coordinator_config().limits.min_in_progress_staleness_threshold_ms == 500


@pytest.mark.parametrize("argv", [
    ["--share-in-progress-staleness-threshold-ms", "5000", "--share-in-progress-max-lock-extension-ms", "4000"],
    ["--share-in-progress-staleness-threshold-ms", "50"],
    ["--share-in-progress-rebalance-grace-ms", "-1"],
    ["--share-min-in-progress-rebalance-grace-ms", "10", "--share-max-in-progress-rebalance-grace-ms", "5"],
    ["--share-max-in-progress-staleness-threshold-ms", "100000000"],
])
def test_in_progress_settings_that_make_no_sense_are_refused(argv):
    with pytest.raises(ConfigError):
        parse(["--upstream", "k:1", *argv])


def test_share_event_log_flags_reach_the_share_settings():
    from proxy.serve import share_settings

    defaults = share_settings(parse(["--upstream", "k:1"]))
    assert (defaults.share_events_enable, defaults.share_events_topic, defaults.share_events_buffer_events,
            defaults.share_events_linger_ms, defaults.share_events_retention_ms, defaults.share_events_partitions) == (
        True, "__share_group_events", 100_000, 100, 604_800_000, 1)
    settings = share_settings(parse(
        ["--upstream", "k:1", "--share-events-enable", "false", "--share-events-topic", "ev",
         "--share-events-linger-ms", "20", "--share-events-partitions", "4"],
        environ={"KSP_SHARE_EVENTS_BUFFER_EVENTS": "10", "KSP_SHARE_EVENTS_RETENTION_MS": "1000"}))
    assert (settings.share_events_enable, settings.share_events_topic, settings.share_events_buffer_events,
            settings.share_events_linger_ms, settings.share_events_retention_ms, settings.share_events_partitions) == (
        False, "ev", 10, 20, 1000, 4)
    assert parse(["--upstream", "k:1"], environ={"KSP_SHARE_EVENTS_ENABLE": "false"}).share_events_enable is False
    log_settings = settings.event_log_settings()
    assert (log_settings.topic, log_settings.buffer_events, log_settings.linger_ms) == ("ev", 10, 20)


@pytest.mark.parametrize("flags", [
    ["--share-events-buffer-events", "0"], ["--share-events-linger-ms", "0"], ["--share-events-partitions", "0"],
    ["--share-events-topic", ""], ["--share-events-retention-ms", "0"], ["--share-events-enable", "maybe"],
])
def test_bad_event_log_flags_are_refused(flags):
    with pytest.raises(ConfigError):
        parse(["--upstream", "k:1", *flags])


def test_dead_letter_flags_default_to_kafkas_broker_configs_and_reach_the_share_settings(tmp_path):
    from proxy.serve import share_settings

    defaults = share_settings(parse(["--upstream", "k:1"]))
    assert (defaults.dead_letter_auto_create_topics, defaults.dead_letter_topic_name_prefix) == (False, "dlq.")
    flags = share_settings(parse(["--upstream", "k:1", "--errors-deadletterqueue-auto-create-topics-enable",
                                  "--errors-deadletterqueue-topic-name-prefix", ""]))
    assert (flags.dead_letter_auto_create_topics, flags.dead_letter_topic_name_prefix) == (True, "")
    environ = {"KSP_ERRORS_DEADLETTERQUEUE_AUTO_CREATE_TOPICS_ENABLE": "true",
               "KSP_ERRORS_DEADLETTERQUEUE_TOPIC_NAME_PREFIX": "dead."}
    from_env = share_settings(parse(["--upstream", "k:1"], environ=environ))
    assert (from_env.dead_letter_auto_create_topics, from_env.dead_letter_topic_name_prefix) == (True, "dead.")
    toml = tmp_path / "proxy.toml"
    toml.write_text('errors-deadletterqueue-auto-create-topics-enable = true\n'
                    'errors_deadletterqueue_topic_name_prefix = "x."\n')
    from_file = share_settings(parse(["--upstream", "k:1", "--config", str(toml)]))
    assert (from_file.dead_letter_auto_create_topics, from_file.dead_letter_topic_name_prefix) == (True, "x.")


# -- security options (docs/security.md) ---------------------------------------------------

def test_security_defaults_are_plaintext_and_authorization_auto():
    config = load_config({"upstream": "k:9092"}, environ={})
    assert not config.listener_tls and not config.upstream_tls and not config.upstream_sasl
    assert config.upstream_security_protocol == "PLAINTEXT"
    assert config.share_authorization == "auto"


def test_upstream_sasl_needs_the_proxy_own_credentials():
    with pytest.raises(ConfigError, match="upstream_sasl_password"):
        load_config({"upstream": "k:9092", "upstream_security_protocol": "sasl_ssl",
                     "upstream_sasl_mechanism": "scram-sha-512", "upstream_sasl_username": "proxy"}, environ={})


def test_sasl_password_from_a_file_is_never_shown(tmp_path):
    secret_file = tmp_path / "password"
    secret_file.write_text("hunter2-secret\n")
    config = load_config({"upstream": "k:9092", "upstream_security_protocol": "SASL_SSL",
                          "upstream_sasl_mechanism": "scram-sha-512", "upstream_sasl_username": "proxy"},
                         environ={"KSP_UPSTREAM_SASL_PASSWORD_FILE": str(secret_file)})
    assert config.upstream_sasl_mechanism == "SCRAM-SHA-512"
    assert config.upstream_sasl_password.value == "hunter2-secret"
    assert "hunter2" not in repr(config) and "hunter2" not in str(config)


def test_password_and_password_file_together_are_refused(tmp_path):
    secret_file = tmp_path / "password"
    secret_file.write_text("x")
    with pytest.raises(ConfigError, match="both given"):
        load_config({"upstream": "k:9092", "upstream_security_protocol": "SASL_PLAINTEXT",
                     "upstream_sasl_mechanism": "PLAIN", "upstream_sasl_username": "proxy",
                     "upstream_sasl_password": "y", "upstream_sasl_password_file": str(secret_file)}, environ={})


def test_oauthbearer_is_refused_for_the_proxy_own_connections():
    with pytest.raises(ConfigError, match="passes through"):
        load_config({"upstream": "k:9092", "upstream_security_protocol": "SASL_SSL", "upstream_sasl_mechanism": "OAUTHBEARER",
                     "upstream_sasl_username": "p", "upstream_sasl_password": "q"}, environ={})


def test_mtls_needs_a_ca_and_tls_listeners():
    with pytest.raises(ConfigError, match="listener_ssl_ca_location"):
        load_config({"upstream": "k:9092", "listener_ssl_certificate_location": "c.pem",
                     "listener_ssl_client_auth": "required"}, environ={})
    with pytest.raises(ConfigError, match="needs TLS listeners"):
        load_config({"upstream": "k:9092", "listener_ssl_client_auth": "required"}, environ={})
