"""deploy/k8s: every manifest passes the Kubernetes schema (strict, offline: kubernetes-validate ships the
schemas), the pieces fit together (selectors, ports, names, the gateway's config, probe paths), and what a cluster
operator asks of a workload holds (non-root, read-only root, resources, tagged images, state on volumes)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate  # the test extra; it ships the schemas, so nothing is downloaded
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
KUBERNETES_VERSION = "1.32"  # the schema version checked against (kubernetes-validate ships 1.25 to 1.37)
NOT_APPLIED = {"kustomization.yaml", "secret.example.yaml"}


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def objects(kustomization) -> dict[tuple[str, str], dict]:
    """What `kubectl apply -k` applies, by (kind, name)."""
    found = {}
    for name in kustomization["resources"]:
        for doc in documents(K8S / name):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in found, f"{name}: {key} defined twice"
            found[key] = doc
    return found


def serving_pods(objects: dict) -> dict[str, dict]:
    """The long-running workloads' pod templates: they take traffic and have probes."""
    return {
        name: doc["spec"]["template"] for (kind, name), doc in objects.items() if kind in ("Deployment", "StatefulSet")
    }


def pod_specs(objects: dict) -> dict[str, dict]:
    """Every pod template, the CronJobs' too."""
    jobs = {
        name: doc["spec"]["jobTemplate"]["spec"]["template"]
        for (kind, name), doc in objects.items()
        if kind == "CronJob"
    }
    return {**serving_pods(objects), **jobs}


def containers(pod: dict) -> list[dict]:
    return pod["spec"].get("initContainers", []) + pod["spec"]["containers"]


def volumes_by_name(pod: dict) -> dict[str, dict]:
    return {v["name"]: v for v in pod["spec"].get("volumes", [])}


def test_kustomization_lists_every_manifest(kustomization):
    on_disk = {p.name for p in K8S.glob("*.yaml")} - NOT_APPLIED
    assert set(kustomization["resources"]) == on_disk


@pytest.mark.parametrize("path", sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_manifest_passes_the_kubernetes_schema(path):
    for doc in documents(K8S / path):
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(
                f"deploy/k8s/{path}: {doc['kind']} {doc['metadata']['name']}: "
                f"{'.'.join(map(str, error.path))}: {error.message}"
            )


def test_schema_check_catches_a_misspelt_field(objects):
    broken = yaml.safe_load(yaml.safe_dump(objects[("Deployment", "maestro-gateway")]))
    broken["spec"]["replica"] = broken["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_services_select_a_workload_on_a_named_port(objects):
    pods = pod_specs(objects)
    for (kind, name), service in objects.items():
        if kind != "Service":
            continue
        selected = [p for p in pods.values() if service["spec"]["selector"].items() <= p["metadata"]["labels"].items()]
        assert len(selected) == 1, f"Service {name} selects {len(selected)} workloads"
        port_names = {p["name"] for c in selected[0]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names, name


def test_probes_autoscaler_and_secrets_point_at_what_exists(objects):
    example = documents(K8S / "secret.example.yaml")[0]
    for name, pod in serving_pods(objects).items():
        for container in pod["spec"]["containers"]:
            assert "readinessProbe" in container and "livenessProbe" in container, f"{name} needs probes"
    for pod in pod_specs(objects).values():
        for container in containers(pod):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == example["metadata"]["name"] and ref["key"] in example["stringData"]
        for volume in pod["spec"].get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in objects
            if "secret" in volume:
                assert {i["key"] for i in volume["secret"]["items"]} <= set(example["stringData"])
    target = objects[("HorizontalPodAutoscaler", "maestro-predictor")]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) in objects


def test_gateway_config_loads_and_names_the_cluster_services(objects, tmp_path):
    from serving.gateway.app import create_app
    from serving.gateway.config import GatewayConfig

    data = yaml.safe_load(objects[("ConfigMap", "maestro-gateway")]["data"]["gateway.yaml"])
    mounted = objects[("Deployment", "maestro-gateway")]["spec"]["template"]["spec"]["containers"][0]
    assert Path(data["server"]["api_keys_file"]).parent.as_posix() in {m["mountPath"] for m in mounted["volumeMounts"]}
    (tmp_path / "keys").write_text("k" * 32 + "\n")  # the Secret's file, as mounted
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({**data, "server": {**data["server"], "api_keys_file": str(tmp_path / "keys")}}))
    config = GatewayConfig.from_file(path)
    vllm = objects[("StatefulSet", "vllm")]["spec"]
    assert [urlsplit(n.url).hostname for n in config.nodes] == [
        f"vllm-{i}.{vllm['serviceName']}" for i in range(vllm["replicas"])
    ]
    predictor = urlsplit(config.predictor.source)
    service = objects[("Service", predictor.hostname)]
    assert predictor.port in {p["port"] for p in service["spec"]["ports"]}
    routes = {route.path for route in create_app(config).routes}
    for probe in ("readinessProbe", "livenessProbe"):
        assert mounted[probe]["httpGet"]["path"] in routes


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed")
def test_kustomize_renders_into_the_namespace():
    rendered = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert {d["metadata"]["namespace"] for d in docs} == {"maestro"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_pod_runs_as_non_root_with_a_read_only_root(objects):
    for name, pod in pod_specs(objects).items():
        assert pod["spec"].get("automountServiceAccountToken") is False, f"{name}: no API token in the pod"
        context = pod["spec"].get("securityContext", {})
        assert context.get("runAsNonRoot") is True and context.get("runAsUser", 0) > 0, f"{name}: pod securityContext"
        assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        for container in containers(pod):
            own = container.get("securityContext", {})
            assert own.get("readOnlyRootFilesystem") is True, f"{name}/{container['name']}: read-only root"
            assert own.get("allowPrivilegeEscalation") is False and own.get("capabilities") == {"drop": ["ALL"]}
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{name}/{container['name']}: a writable /tmp (emptyDir) under a read-only root"


def test_every_container_has_requests_and_a_memory_limit(objects):
    for name, pod in pod_specs(objects).items():
        for container in containers(pod):
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), f"{name}/{container['name']}: requests"
            assert "memory" in resources.get("limits", {}), f"{name}/{container['name']}: a memory limit"


def test_images_are_pinned_by_tag(objects, kustomization):
    for name, pod in pod_specs(objects).items():
        for container in containers(pod):
            image = container["image"]
            tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
            assert tag and tag != "latest", f"{name}/{container['name']}: image {image} needs an explicit tag"
    for image in kustomization.get("images", []):
        assert image.get("newTag") and image["newTag"] != "latest", f"kustomization images: {image['name']}"


def test_no_secret_is_a_literal_env_value(objects):
    for name, pod in pod_specs(objects).items():
        for container in containers(pod):
            for env in container.get("env", []):
                if any(word in env["name"] for word in ("TOKEN", "KEY", "SECRET", "PASSWORD")):
                    assert "value" not in env, f"{name}: {env['name']} from a Secret, not a literal"


def test_the_autoscaled_deployment_leaves_replicas_to_the_hpa(objects):
    for (kind, _), hpa in objects.items():
        if kind == "HorizontalPodAutoscaler":
            target = hpa["spec"]["scaleTargetRef"]
            assert "replicas" not in objects[(target["kind"], target["name"])]["spec"], target["name"]


def test_vllm_keeps_its_weights_on_a_volume_with_shared_memory_and_a_token_secret(objects):
    statefulset = objects[("StatefulSet", "vllm")]["spec"]
    pod = statefulset["template"]
    engine = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in engine["env"]}
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    claims = {t["metadata"]["name"] for t in statefulset["volumeClaimTemplates"]}
    assert mounts[str(Path(env["HF_HOME"]["value"]).parent)] in claims  # the weights outlive the pod
    assert volumes_by_name(pod)[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "secretKeyRef" in env["HF_TOKEN"]["valueFrom"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == engine["resources"]["requests"]["nvidia.com/gpu"]


def test_observed_traces_are_on_persistent_volume_claims(objects):
    directories = {
        "maestro-gateway": yaml.safe_load(objects[("ConfigMap", "maestro-gateway")]["data"]["gateway.yaml"])["traces"][
            "dir"
        ],
        "maestro-predictor": {
            e["name"]: e.get("value") for e in pod_specs(objects)["maestro-predictor"]["spec"]["containers"][0]["env"]
        }["MAESTRO_TRACE_DIR"],
    }
    for name, directory in directories.items():
        pod = pod_specs(objects)[name]
        mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == directory)
        claim = volumes_by_name(pod)[mount["name"]]["persistentVolumeClaim"]["claimName"]
        assert ("PersistentVolumeClaim", claim) in objects, f"{name}: traces on PVC {claim}"
    hpa_max = objects[("HorizontalPodAutoscaler", "maestro-predictor")]["spec"]["maxReplicas"]
    shared = objects[("PersistentVolumeClaim", "maestro-predictor-observed")]["spec"]["accessModes"]
    assert hpa_max == 1 or "ReadWriteMany" in shared  # every replica the HPA starts mounts it


def test_the_retrain_cronjob_runs_maestro_retrain_on_the_gateway_traces_against_every_predictor_pod(objects):
    from maestro.cli import build_parser

    cronjob = objects[("CronJob", "maestro-retrain")]["spec"]
    assert cronjob["concurrencyPolicy"] == "Forbid"  # two retrains would race on the registry and the workspace
    pod = cronjob["jobTemplate"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    args = build_parser().parse_args(container["command"][1:])  # what the real CLI makes of it
    assert container["command"][0] == "maestro" and args.command == "retrain" and args.on_drift and args.resolve_nodes
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    gateway_dir = yaml.safe_load(objects[("ConfigMap", "maestro-gateway")]["data"]["gateway.yaml"])["traces"]["dir"]
    assert args.traces == gateway_dir and mounts[gateway_dir]["readOnly"] is True
    gateway = serving_pods(objects)["maestro-gateway"]
    gateway_mount = next(m for m in gateway["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == gateway_dir)
    claim = volumes_by_name(gateway)[gateway_mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert volumes_by_name(pod)[mounts[gateway_dir]["name"]]["persistentVolumeClaim"]["claimName"] == claim
    affinity = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert affinity["labelSelector"]["matchLabels"].items() <= gateway["metadata"]["labels"].items()  # RWO volume
    assert mounts[args.repo.rsplit("/", 1)[0]]["name"] in volumes_by_name(pod)
    node = urlsplit(args.nodes)
    headless = objects[("Service", node.hostname)]["spec"]
    predictor = serving_pods(objects)["maestro-predictor"]
    assert headless["clusterIP"] == "None" and headless["selector"].items() <= predictor["metadata"]["labels"].items()
    assert node.port in {p["port"] for p in headless["ports"]}
    allowed = objects[("NetworkPolicy", "maestro-predictor")]["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert allowed["matchLabels"].items() <= pod["metadata"]["labels"].items()
    env = {e["name"] for e in container["env"]}
    assert {"MAESTRO_ADMIN_TOKEN", "MLFLOW_TRACKING_URI"} <= env
    predictor_env = {e["name"] for e in predictor["spec"]["containers"][0]["env"]}
    assert "MLFLOW_TRACKING_URI" in predictor_env  # the pods reload the versions retrain registers
