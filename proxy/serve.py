"""``share-proxy serve``: run the proxy until SIGTERM/SIGINT.

Prints exactly one line to stdout, ``ready bootstrap=HOST:PORT``, once every
listener is open; everything else goes to the log on stderr. SIGHUP reloads the
listener certificate, key and CA files at once.

Exit codes: 0 after a signal, 1 when the proxy fails while running, 2 for a bad
configuration -- including TLS files that do not load, and an upstream that
refuses the proxy's TLS handshake or its service credentials at start-up (one
line on stderr: ``share-proxy: upstream authentication failed as user ...``).
"""

from __future__ import annotations

import argparse
import signal
import sys

import structlog
import trio

from proxy.allocator import limit_arenas, release_freed_memory, retain_freed_memory
from proxy.collector import freeze_startup_objects, time_pauses, tune_collector
from proxy.config import ProxyConfig, configure_parser, load_config
from proxy.errors import ConfigError, ProxyError, UpstreamAuthenticationError, UpstreamError, UpstreamTlsError
from proxy.health import READINESS, HealthEndpoints, Liveness, UpstreamProbe, serve_health
from proxy.logging import configure_logging
from proxy.server import Proxy
from proxy.upstream import open_first_upstream

#: Errors that end start-up with exit code 2: the configuration cannot work (not an outage).
FATAL_AT_START = (ConfigError, UpstreamAuthenticationError, UpstreamTlsError)


def configure(parser: argparse.ArgumentParser) -> None:
    configure_parser(parser)


def tune_allocator(config: ProxyConfig) -> None:
    """The C allocator's settings (docs/proxy.md, "Memory reuse"), applied before any thread starts:
    an arena glibc has made stays, whatever the cap set later."""
    log = structlog.get_logger("proxy.serve")
    if config.heap_retain_bytes and not retain_freed_memory(config.heap_retain_bytes):
        log.info("heap_retain_bytes not applied: the C library is not glibc, or mallopt refused")
    if config.malloc_arenas and not limit_arenas(config.malloc_arenas):
        log.info("malloc_arenas not applied: the C library is not glibc, or mallopt refused")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"share-proxy serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_json)
    log = structlog.get_logger("proxy.serve")
    tune_allocator(config)
    tune_collector(config.gc_threshold)
    time_pauses()
    try:
        trio.run(serve, config)
    except FATAL_AT_START as error:
        print(f"share-proxy: {error}", file=sys.stderr, flush=True)
        return 2
    except BaseExceptionGroup as group:
        fatal, _ = group.split(FATAL_AT_START)
        if fatal is not None:
            print(f"share-proxy: {_first_leaf(fatal)}", file=sys.stderr, flush=True)
            return 2
        failures, rest = group.split(ProxyError)
        if rest is not None:
            raise
        for error in failures.exceptions:
            log.error("proxy failed", error=str(error))
        return 1
    except ProxyError as error:
        log.error("proxy failed", error=str(error))
        return 1
    return 0


def share_settings(config: ProxyConfig):
    from proxy.share.runtime import ShareSettings

    return ShareSettings(
        state_topic=config.state_topic,
        state_topic_partitions=config.state_topic_partitions,
        state_topic_replication_factor=config.state_topic_replication_factor,
        state_topic_min_insync_replicas=config.state_topic_min_insync_replicas,
        max_share_sessions=config.max_share_sessions,
        max_share_session_partitions=config.max_share_session_partitions,
        max_share_session_partitions_total=config.max_share_session_partitions_total,
        record_lock_duration_ms=config.share_record_lock_duration_ms,
        min_record_lock_duration_ms=config.share_min_record_lock_duration_ms,
        delivery_count_limit=config.share_delivery_count_limit,
        session_timeout_ms=config.share_session_timeout_ms,
        min_session_timeout_ms=config.share_min_session_timeout_ms,
        heartbeat_interval_ms=config.share_heartbeat_interval_ms,
        min_heartbeat_interval_ms=config.share_min_heartbeat_interval_ms,
        partition_max_record_locks=config.share_partition_max_record_locks,
        max_record_lock_duration_ms=config.share_max_record_lock_duration_ms,
        max_session_timeout_ms=config.share_max_session_timeout_ms,
        max_heartbeat_interval_ms=config.share_max_heartbeat_interval_ms,
        min_delivery_count_limit=config.share_min_delivery_count_limit,
        max_delivery_count_limit=config.share_max_delivery_count_limit,
        min_partition_max_record_locks=config.share_min_partition_max_record_locks,
        max_partition_max_record_locks=config.share_max_partition_max_record_locks,
        in_progress_staleness_threshold_ms=config.share_in_progress_staleness_threshold_ms,
        in_progress_max_lock_extension_ms=config.share_in_progress_max_lock_extension_ms,
        in_progress_rebalance_grace_ms=config.share_in_progress_rebalance_grace_ms,
        min_in_progress_staleness_threshold_ms=config.share_min_in_progress_staleness_threshold_ms,
        max_in_progress_staleness_threshold_ms=config.share_max_in_progress_staleness_threshold_ms,
        min_in_progress_max_lock_extension_ms=config.share_min_in_progress_max_lock_extension_ms,
        max_in_progress_max_lock_extension_ms=config.share_max_in_progress_max_lock_extension_ms,
        min_in_progress_rebalance_grace_ms=config.share_min_in_progress_rebalance_grace_ms,
        max_in_progress_rebalance_grace_ms=config.share_max_in_progress_rebalance_grace_ms,
        auto_offset_reset=config.share_auto_offset_reset,
        metadata_refresh_ms=config.share_metadata_refresh_ms,
        state_write_timeout_ms=config.state_write_timeout_ms,
        state_linger_ms=config.state_linger_ms,
        state_writes_in_flight=config.state_writes_in_flight,
        state_producers=config.state_producers,
        state_deltas=config.state_deltas == "on",
        state_fencing="transactional" if config.instance_id is not None else config.state_fencing,
        instance_id=config.instance_id,
        instance_slot=config.instance_slot,
        ownership_session_timeout_ms=config.ownership_session_timeout_ms,
        share_config_refresh_ms=config.share_config_refresh_ms,
        state_transactional_id_prefix=config.state_transactional_id_prefix,
        state_snapshot_every=config.state_snapshot_every,
        read_cache_bytes=config.share_read_cache_bytes,
        upstream_connections=config.share_upstream_connections,
        long_poll_connections=config.share_long_poll_connections,
        metrics_per_partition=config.metrics_per_partition,
        share_events_enable=config.share_events_enable,
        share_events_topic=config.share_events_topic,
        share_events_buffer_events=config.share_events_buffer_events,
        share_events_linger_ms=config.share_events_linger_ms,
        share_events_retention_ms=config.share_events_retention_ms,
        share_events_partitions=config.share_events_partitions,
        dead_letter_auto_create_topics=config.errors_deadletterqueue_auto_create_topics_enable,
        dead_letter_topic_name_prefix=config.errors_deadletterqueue_topic_name_prefix,
    )


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def check_upstream_credentials(proxy: Proxy) -> None:
    """With upstream TLS or SASL: connect once to the first reachable --upstream as the proxy
    (TLS, service credentials). A refused handshake or refused credentials raise (start-up ends,
    exit code 2); an unreachable upstream only logs -- start-up then waits for it, as always."""
    config = proxy.config
    if proxy.upstream_security is None:
        return
    log = structlog.get_logger("proxy.serve")
    try:
        address, stream = await open_first_upstream(
            config.upstream, timeout=config.connect_timeout, max_frame_size=config.max_upstream_frame_size,
            security=proxy.upstream_security, authenticate=True,
        )
    except (UpstreamAuthenticationError, UpstreamTlsError):
        raise
    except UpstreamError as exc:
        log.warning("upstream unreachable at start; credentials not checked yet", error=str(exc))
        return
    await trio.aclose_forcefully(stream)
    sasl = proxy.upstream_security.sasl
    log.info("upstream credentials accepted", via=str(address), protocol=config.upstream_security_protocol,
             user=sasl.username if sasl else None, mechanism=sasl.mechanism if sasl else None)


async def serve(config: ProxyConfig) -> None:
    proxy = Proxy(config)
    log = structlog.get_logger("proxy.serve")
    stop = trio.Event()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as service_nursery:

            async def watch_signals() -> None:
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        if proxy.listener_tls is None:
                            log.info("SIGHUP: no TLS listener certificate to reload")
                        else:
                            proxy.listener_tls.maybe_reload(force=True)
                        continue
                    log.info("signal", signal=signal.Signals(signum).name)
                    READINESS.set("listening", False)  # shutting down: take no new clients
                    stop.set()
                    proxy.shutdown()

            service_nursery.start_soon(watch_signals)
            READINESS.set("listening", False)
            if config.metrics_port is not None:
                # Before start-up: /readyz answers (not ready) while the share state replays.
                await start_health(config, service_nursery, proxy.upstream_security)
            service = None
            # A signal during start-up (e.g. while the upstream cluster is still
            # unreachable) abandons the start instead of being swallowed.
            with trio.CancelScope() as startup:
                service_nursery.start_soon(_cancel_when_set, stop, startup)
                await check_upstream_credentials(proxy)
                if not config.disable_share_groups:
                    from proxy.share.runtime import start_share_service

                    # Share state is loaded before the listeners open, so no client is
                    # served from partial state.
                    READINESS.set("share_state_replayed", False)
                    service = await start_share_service(proxy, share_settings(config), service_nursery)
                    READINESS.set("share_state_replayed", True)
                    READINESS.set_check("share_state_writable", lambda: service.state_writable)
            if not stop.is_set():
                if config.gc_threshold:
                    # Start-up objects (modules, schemas, replayed state) are never walked again.
                    log.debug("start-up objects frozen", objects=freeze_startup_objects())
                if service is not None:
                    release_freed_memory()  # what the replay read is garbage now
                async with trio.open_nursery() as nursery:
                    bootstrap = await nursery.start(proxy.run)
                    if service is not None and service.scale_out is not None:
                        # Joins the ownership group once its endpoints are known (issue 15).
                        await service.scale_out.join(int(str(bootstrap).rsplit(":", 1)[1]), service_nursery)
                    READINESS.set("listening", not stop.is_set())
                    print(f"ready bootstrap={bootstrap}", flush=True)
                    # proxy.run returns once a signal has called proxy.shutdown().
            # Every client connection is closed: flush state writes, then stop the service.
            if service is not None:
                with trio.move_on_after(config.shutdown_grace, shield=True):
                    await service.aclose()
            service_nursery.cancel_scope.cancel()


async def start_health(config: ProxyConfig, nursery: trio.Nursery, security=None) -> None:
    """/metrics, /healthz and /readyz on --metrics-port, with the upstream probe readiness uses."""
    liveness = Liveness()
    probe = UpstreamProbe(config.upstream, max_frame_size=config.max_upstream_frame_size, security=security)
    READINESS.set_check("upstream_reachable", lambda: probe.reachable)
    nursery.start_soon(liveness.run)
    nursery.start_soon(probe.run)
    host = config.listen.host if config.metrics_host is None else config.metrics_host
    await nursery.start(serve_health, host, config.metrics_port, HealthEndpoints(READINESS, liveness))


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
