"""infra/docker-compose.yml, checked as Compose would read it (Docker cannot run here)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import click
import pytest
from infra_compose import (
    COMPOSE,
    DBRP_SCRIPT,
    ENV_EXAMPLE,
    INFRA,
    REPO,
    TOPICS_SCRIPT,
    MissingVariable,
    load_compose,
    raw_compose,
    read_env_file,
    service_env,
    uses_pulse_image,
    variables,
)

from pulse.cli import COMMANDS, main
from pulse.settings import ENV_VARS, Settings

SECRETS = {"PULSE_INFLUX_TOKEN": "test-token", "INFLUX_ADMIN_PASSWORD": "pw-test-123",
           "GRAFANA_ADMIN_PASSWORD": "pw-grafana"}


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    e = read_env_file()
    e.update(SECRETS)
    return e


@pytest.fixture(scope="module")
def compose(env: dict[str, str]) -> dict:
    return load_compose(env)


def test_compose_parses_and_has_every_service(compose: dict) -> None:
    services = compose["services"]
    for name in ("kafka", "kafka-topics", "influxdb", "grafana", "demo-producer"):
        assert name in services, f"service {name} missing"
    workers = [n for n, s in services.items() if s.get("command", [None, None])[:2] == ["pulse", "worker"]]
    assert len(workers) >= 1
    assert services["demo-producer"]["profiles"] == ["demo"]
    for name in workers:
        assert "profiles" not in services[name], "workers run by default"


def test_images_are_pinned(compose: dict) -> None:
    for name, svc in compose["services"].items():
        image = svc.get("image")
        assert image, f"{name}: no image"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d", tag), f"{name}: image {image!r} not pinned"
    assert compose["services"]["kafka"]["image"].startswith("apache/kafka:")
    assert compose["services"]["influxdb"]["image"].startswith("influxdb:2.")


def test_kafka_is_kraft_single_node_with_a_healthcheck_on_its_own_listener(compose: dict) -> None:
    kafka = compose["services"]["kafka"]
    env = service_env(kafka)
    assert not any("ZOOKEEPER" in k for k in env)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{node_id}@")
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    listeners = dict(
        (part.split("://")[0], part.split(":")[-1]) for part in env["KAFKA_LISTENERS"].split(","))
    test = " ".join(kafka["healthcheck"]["test"])
    m = re.search(r"--bootstrap-server localhost:(\d+)", test)
    assert m, test
    assert m.group(1) in listeners.values(), "the healthcheck must hit a listener of the container"
    # The bootstrap address every client in the compose network uses is the advertised one:
    # Pulse's own clients that of the SASL_SSL listener, the topic job the internal one.
    advertised = dict(p.split("://") for p in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    internal = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
    (secure,) = [n for n, proto in protocols.items() if proto == "SASL_SSL"]
    for name, svc in compose["services"].items():
        broker = service_env(svc).get("PULSE_BROKER")
        if broker is not None:
            want = advertised[secure] if uses_pulse_image(svc) else advertised[internal]
            assert broker == want, f"{name}: PULSE_BROKER={broker}"


def test_healthchecks_and_dependencies(compose: dict) -> None:
    services = compose["services"]
    for name in ("kafka", "influxdb", "grafana"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: depends_on needs conditions (long form)"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown {dep}"
            cond = spec["condition"]
            assert cond in ("service_healthy", "service_completed_successfully"), (name, dep, cond)
            if cond == "service_healthy":
                assert services[dep].get("healthcheck", {}).get("test"), f"{dep} has no healthcheck"
            else:
                assert services[dep].get("restart") == "no", f"{dep} is one-shot: restart must be 'no'"
    for svc in services.values():
        if svc.get("command", [None, None])[:2] == ["pulse", "worker"]:
            deps = svc["depends_on"]
            assert deps["kafka"]["condition"] == "service_healthy"
            assert deps["kafka-topics"]["condition"] == "service_completed_successfully"
            assert deps["influxdb"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["influxdb"]["condition"] == "service_healthy"


def test_named_volumes_hold_the_data(compose: dict) -> None:
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, svc in compose["services"].items():
        for v in svc.get("volumes") or []:
            src = v.split(":")[0]
            if src.startswith("."):
                assert (COMPOSE.parent / src).exists(), f"{name}: bind source {src} missing"
            else:
                assert src in declared, f"{name}: volume {src} not declared"
                used.add(src)
    assert declared == used
    mounts = {s: [v.split(":")[1] for v in compose["services"][s].get("volumes", [])]
              for s in ("kafka", "influxdb", "grafana")}
    assert "/var/lib/influxdb2" in mounts["influxdb"]
    assert "/var/lib/grafana" in mounts["grafana"]
    kafka_dirs = service_env(compose["services"]["kafka"])["KAFKA_LOG_DIRS"]
    assert kafka_dirs in mounts["kafka"]


def _leftover(ctx: click.Context) -> list[str]:
    # click 8.2+ keeps the subcommand and its args in _protected_args (protected_args is
    # deprecated); older versions only have protected_args.
    protected = getattr(ctx, "_protected_args", None)
    if protected is None:
        protected = ctx.protected_args
    return [*protected, *ctx.args]


def _parse_pulse_args(args: list[str]) -> list[str]:
    """Let click parse ``pulse ARGS`` down to the leaf command, as running it would
    (without invoking it); return the command path."""
    ctx = main.make_context("pulse", list(args))
    group: click.Group = main
    path = ["pulse"]
    rest = _leftover(ctx)
    while True:
        name, cmd, rest = group.resolve_command(ctx, rest)
        assert cmd is not None, f"pulse {' '.join(args)}: no command {name}"
        path.append(name)
        ctx = cmd.make_context(name, list(rest), parent=ctx)
        if not isinstance(cmd, click.Group):
            return path
        group = cmd
        rest = _leftover(ctx)
        if not rest:
            return path


def test_every_command_is_a_pulse_subcommand_or_the_images_own(compose: dict) -> None:
    pulse_services = 0
    for name, svc in compose["services"].items():
        if uses_pulse_image(svc):
            pulse_services += 1
            cmd = svc["command"]
            assert isinstance(cmd, list) and cmd[0] == "pulse", f"{name}: {cmd!r}"
            assert cmd[1] in COMMANDS, f"{name}: {cmd[1]} is not a pulse subcommand"
            assert "entrypoint" not in svc
            path = _parse_pulse_args(cmd[1:])
            assert path[1] == cmd[1]
        else:
            # Third-party images run their own entrypoint, or a script of ours mounted in.
            entry = svc.get("entrypoint")
            if entry is not None:
                script = entry[-1]
                mounted = {v.split(":")[1]: v.split(":")[0] for v in svc.get("volumes", [])}
                assert script in mounted, f"{name}: {script} is not mounted"
                assert (COMPOSE.parent / mounted[script]).is_file()
            assert "command" not in svc or not str(svc["command"]).startswith("pulse"), name
    assert pulse_services >= 2


def test_the_command_check_rejects_what_pulse_would_reject() -> None:
    with pytest.raises(click.UsageError):
        _parse_pulse_args(["report", "--no-such-option"])
    with pytest.raises(click.UsageError):
        _parse_pulse_args(["no-such-command"])
    with pytest.raises(click.UsageError):
        _parse_pulse_args(["produce", "sim", "--no-such-option"])
    with pytest.raises(click.UsageError):
        _parse_pulse_args(["produce", "no-such-source"])
    assert _parse_pulse_args(["report", "--from-influx", "http://x:8086", "--job", "j"]) == ["pulse", "report"]
    assert _parse_pulse_args(["produce", "sim", "--seed", "3"]) == ["pulse", "produce", "sim"]


def test_pulse_env_names_are_settings_names() -> None:
    texts = {p: p.read_text() for p in [COMPOSE, ENV_EXAMPLE, *INFRA.glob("grafana/provisioning/**/*.yaml")]}
    seen = set()
    for p, text in texts.items():
        for name in re.findall(r"\bPULSE_[A-Z0-9_]+", text):
            assert name in ENV_VARS, f"{p.name}: {name} is not a variable pulse.settings reads"
            seen.add(name)
    assert {"PULSE_BROKER", "PULSE_INFLUX_URL", "PULSE_INFLUX_TOKEN", "PULSE_PARTITIONS"} <= seen


def _with_secret_files(env: dict[str, str], tmp: Path) -> dict[str, str]:
    """The service's environment with /run/secrets/<name> files made in ``tmp``."""
    out = dict(env)
    for k, v in env.items():
        if v.startswith("/run/secrets/"):
            f = tmp / v.rsplit("/", 1)[1]
            f.write_text("compose-test-secret")
            out[k] = str(f)
    return out


def test_worker_environment_builds_valid_settings(compose: dict, tmp_path: Path) -> None:
    for name, svc in compose["services"].items():
        if uses_pulse_image(svc):
            env = _with_secret_files(service_env(svc), tmp_path)
            s = Settings.from_env(env)
            assert s.broker == "kafka:9094", name
            assert (s.kafka_security_protocol, s.kafka_sasl_password) == ("SASL_SSL", "compose-test-secret"), name
            assert s.influx_url == "http://influxdb:8086", name
            assert s.influx_token == SECRETS["PULSE_INFLUX_TOKEN"], name
            influx = service_env(compose["services"]["influxdb"])
            assert s.influx_org == influx["DOCKER_INFLUXDB_INIT_ORG"]
            assert s.influx_bucket == influx["DOCKER_INFLUXDB_INIT_BUCKET"]
            assert s.influx_token == influx["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"]


def test_secrets_come_from_the_env_file_only() -> None:
    raw = raw_compose()
    example = read_env_file()
    for name in variables(COMPOSE.read_text()):
        assert name in example, f"{name} is used by docker-compose.yml but not documented in .env.example"
    for secret in SECRETS:
        assert example[secret] == "", f".env.example must not ship a value for {secret}"
    # No literal secret in the compose file: every password/token value is a substitution.
    for name, svc in raw["services"].items():
        for k, v in service_env(svc).items():
            if re.search(r"PASSWORD|TOKEN", k) and not k.endswith("_FILE"):
                assert "${" in v, f"{name}: {k} has a literal value"
    # And a missing secret stops compose instead of starting with an empty one.
    env = read_env_file()
    with pytest.raises(MissingVariable):
        load_compose(env)


def test_workers_form_one_consumer_group(compose: dict, tmp_path: Path) -> None:
    # PULSE_WORKER_ID is the Faust app id, i.e. the consumer group: workers must share it so
    # that they split the partitions instead of each processing everything.
    workers = [s for s in compose["services"].values() if s.get("command", [None, None])[:2] == ["pulse", "worker"]]
    assert len(workers) >= 2
    ids = {Settings.from_env(_with_secret_files(service_env(s), tmp_path)).worker_id for s in workers}
    assert len(ids) == 1


def test_scripts_are_valid_bash() -> None:
    for script in (TOPICS_SCRIPT, DBRP_SCRIPT):
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_influxdb_init_creates_the_dbrp_grafana_queries(compose: dict) -> None:
    influx = compose["services"]["influxdb"]
    env = service_env(influx)
    assert env["DOCKER_INFLUXDB_INIT_MODE"] == "setup"
    for k in ("USERNAME", "PASSWORD", "ORG", "BUCKET", "ADMIN_TOKEN"):
        assert env[f"DOCKER_INFLUXDB_INIT_{k}"], k
    mounts = {v.split(":")[1]: v.split(":")[0] for v in influx["volumes"]}
    init_dir = COMPOSE.parent / mounts["/docker-entrypoint-initdb.d"]
    assert DBRP_SCRIPT.parent.resolve() == init_dir.resolve()
    text = DBRP_SCRIPT.read_text()
    assert "influx v1 dbrp create" in text and "DOCKER_INFLUXDB_INIT_BUCKET_ID" in text
    # The database the mapping creates is the one Grafana's datasource names.
    import yaml

    ds = yaml.safe_load((INFRA / "grafana/provisioning/datasources/pulse.yaml").read_text())["datasources"][0]
    gf_env = service_env(compose["services"]["grafana"])
    from infra_compose import interpolate

    assert interpolate(ds["jsonData"]["dbName"], gf_env) == env["INFLUX_V1_DB"]
    assert interpolate(ds["secureJsonData"]["httpHeaderValue1"], gf_env) == f"Token {SECRETS['PULSE_INFLUX_TOKEN']}"


def test_grafana_mounts_provisioning_and_dashboards(compose: dict) -> None:
    import yaml

    gf = compose["services"]["grafana"]
    mounts = {v.split(":")[1]: (COMPOSE.parent / v.split(":")[0]).resolve() for v in gf["volumes"] if v.startswith(".")}
    prov = mounts["/etc/grafana/provisioning"]
    provider = yaml.safe_load((prov / "dashboards" / "pulse.yaml").read_text())["providers"][0]
    dash_dir = mounts[provider["options"]["path"]]
    assert sorted(dash_dir.glob("*.json")), "no dashboards where the provider looks"
    home = service_env(gf)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (dash_dir / home.rsplit("/", 1)[1]).is_file()


def test_dockerfile_builds_the_pulse_image() -> None:
    text = (INFRA / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert froms and re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", froms[0]), froms
    assert re.search(r"pip install .*\.\s*(\\|$)", text, re.M)
    assert "USER " in text
    assert not re.search(r"(?i)(token|password)\s*=", text.replace("PIP_", ""))
    # The build context is the repository root (pyproject.toml lives there).
    raw = raw_compose()
    for svc in raw["services"].values():
        if uses_pulse_image(svc):
            assert (COMPOSE.parent / svc["build"]["context"]).resolve() == REPO


def test_pulse_clients_use_the_sasl_ssl_listener_with_file_secrets(compose: dict) -> None:
    """The broker's SASL_SSL listener and Pulse's clients agree: same user, same password file
    (the broker reads it through DirectoryConfigProvider), the CA and keystore as secrets."""
    kafka = compose["services"]["kafka"]
    kenv = service_env(kafka)
    declared = compose["secrets"]
    assert {"kafka_keystore", "kafka_pulse_password"} <= set(kafka["secrets"]) <= set(declared)
    assert kenv["KAFKA_SSL_KEYSTORE_TYPE"] == "PEM"
    assert kenv["KAFKA_SSL_KEYSTORE_LOCATION"] == "/run/secrets/kafka_keystore"
    assert kenv["KAFKA_CONFIG_PROVIDERS_DIR_CLASS"].endswith(".DirectoryConfigProvider")
    jaas = kenv["KAFKA_LISTENER_NAME_PULSE_PLAIN_SASL_JAAS_CONFIG"]
    assert "PlainLoginModule required" in jaas and jaas.rstrip().endswith(";")
    for name, svc in compose["services"].items():
        if not uses_pulse_image(svc):
            continue
        env = service_env(svc)
        assert env["PULSE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", name
        assert env["PULSE_KAFKA_SASL_MECHANISM"] in kenv["KAFKA_SASL_ENABLED_MECHANISMS"].split(","), name
        user, password_file = env["PULSE_KAFKA_SASL_USERNAME"], env["PULSE_KAFKA_SASL_PASSWORD_FILE"]
        secret = password_file.removeprefix("/run/secrets/")
        assert f'user_{user}="${{dir:/run/secrets:{secret}}}"' in jaas, (name, jaas)
        assert secret in svc["secrets"] and secret in kafka["secrets"], name
        assert env["PULSE_KAFKA_SSL_CAFILE"].removeprefix("/run/secrets/") in svc["secrets"], name
        assert not any("PASSWORD" in k and not k.endswith("_FILE") for k in env), name
