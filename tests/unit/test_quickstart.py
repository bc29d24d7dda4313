"""The EKS and GKE quick starts (docs/quickstart-*.md) render as written, and every name they
pass from the cloud side to the chart is one the cloud side makes.

Each page's `helm install` is taken from the page itself (its sh block), its shell variables
replaced by what the page assigns them from: a literal of the page, or a CloudFormation output
(``deploy/aws/reclaimd.cfn.yaml``) / Terraform output (``deploy/gcp/main.tf``) that must exist,
with the value that output takes under the template's defaults. The chart is rendered by helm
with exactly those flags and the page's values file, which the page must quote verbatim.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm_chart import HELM, KUBE_VERSION, REPO, helm, only, settings_of

__all__ = ["helm"]  # the fixture: helm must be there

EKS = REPO / "docs" / "quickstart-eks.md"
GKE = REPO / "docs" / "quickstart-gke.md"
CFN = REPO / "deploy" / "aws" / "reclaimd.cfn.yaml"
TF = REPO / "deploy" / "gcp" / "main.tf"


class CfnLoader(yaml.SafeLoader):
    pass


CfnLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def cfn() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.load(CFN.read_text(), Loader=CfnLoader)
    return doc


def tf_blocks(kind: str) -> dict[str, str]:
    """``variable``/``output`` name -> its block's text (main.tf's blocks end at a '}' alone)."""
    text = TF.read_text()
    return {
        m.group(1): m.group(2)
        for m in re.finditer(rf'^{kind} "([\w-]+)" \{{\n(.*?)^\}}', text, re.M | re.S)
    }


def tf_default(name: str) -> Any:
    block = tf_blocks("variable")[name]
    m = re.search(r"^  default\s*=\s*(.+)$", block, re.M)
    assert m, f"variable {name} has no default"
    return yaml.safe_load(m.group(1))


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), re.M | re.S)


def commands(page: Path) -> list[str]:
    """Every command of the page's sh blocks, continuation lines joined, comments dropped."""
    out: list[str] = []
    for block in blocks(page, "sh"):
        joined = re.sub(r"\\\n\s*", " ", block)
        for raw in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", raw).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def assignments(page: Path) -> dict[str, str]:
    return {
        m.group(1): m.group(2) for c in commands(page) if (m := re.match(r"^([A-Z_]+)=(.*)$", c))
    }


def one(cmds: list[str], prefix: str) -> str:
    found = [c for c in cmds if c.startswith(prefix)]
    assert len(found) == 1, f"{len(found)} commands start with {prefix!r}"
    return found[0]


def flag(cmd: str, name: str) -> list[str]:
    words = shlex.split(cmd.replace("$", ""))
    return [words[i + 1] for i, w in enumerate(words) if w == name]


def render_install(page: Path, values: dict[str, str]) -> list[dict[str, Any]]:
    """The page's `helm install`, its variables replaced, run as `helm template`."""
    cmd = one(commands(page), "helm install ")
    used = set(re.findall(r"\$([A-Z_]+)", cmd))
    assigned = assignments(page)
    assert used <= set(assigned), f"used but never assigned: {used - set(assigned)}"
    assert used <= set(values), f"the test has no value for {used - set(values)}"
    for name in sorted(used, key=len, reverse=True):
        cmd = cmd.replace(f"${name}", values[name])
    words = shlex.split(cmd)
    assert words[:4] == ["helm", "install", "reclaimd", "deploy/helm/reclaimd"], words[:4]
    rest = [w for w in words[4:] if w != "--create-namespace"]
    done = subprocess.run(
        [str(HELM), "template", "reclaimd", "deploy/helm/reclaimd", *rest,
         "--kube-version", KUBE_VERSION],
        capture_output=True, text=True, check=False, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def quotes_its_values_file(page: Path, name: str) -> None:
    text = (REPO / "docs" / "quickstart" / name).read_text()
    assert text in blocks(page, "yaml"), f"{page.name} does not quote docs/quickstart/{name}"
    assert f"-f docs/quickstart/{name}" in one(commands(page), "helm install ")


def literal(assigned: dict[str, str], name: str) -> str:
    value = assigned[name]
    assert not value.startswith("$("), f"{name} is not a literal"
    return value


# --- EKS ---------------------------------------------------------------------------------------


def eks_values() -> dict[str, str]:
    """Each variable of the EKS page as its source makes it."""
    page, template = assignments(EKS), cfn()
    outputs, params = template["Outputs"], template["Parameters"]
    out_fn = one(commands(EKS), "out() {")
    assert "--stack-name reclaimd" in out_fn and "OutputKey=='$1'" in out_fn
    for var, key in (("QUEUE_URL", "QueueUrl"), ("POLICY_ARN", "PolicyArn"),
                     ("MSK_POLICY_ARN", "MskIamPolicyArn")):  # fmt: skip
        assert page[var] == f"$(out {key})", var
        assert key in outputs, f"the stack has no output {key}"
    assert outputs["QueueUrl"]["Value"] == {"Ref": "Queue"}  # a queue's Ref is its URL
    deploy = one(commands(EKS), "aws cloudformation deploy ")
    assert "--template-file deploy/aws/reclaimd.cfn.yaml" in deploy
    for p in re.findall(r"(\w+)=\"\$", deploy):
        assert p in params, f"the template has no parameter {p}"
    region, msk_arn = literal(page, "REGION"), literal(page, "MSK_ARN")
    account = msk_arn.split(":")[4]
    role = re.fullmatch(r"\$\(aws iam get-role --role-name ([\w-]+) .*\)", page["ROLE_ARN"])
    assert role, page["ROLE_ARN"]
    return {
        "CLUSTER": literal(page, "CLUSTER"),
        "REGION": region,
        "IMAGE": literal(page, "IMAGE"),
        "TAG": literal(page, "TAG"),
        "QUEUE_URL": f"https://sqs.{region}.amazonaws.com/{account}/"
        + params["QueueName"]["Default"],
        "ROLE_ARN": f"arn:aws:iam::{account}:role/{role.group(1)}",
        "BOOTSTRAP": "b-1.my-msk.abc123.c2.kafka.us-east-1.amazonaws.com:9098,"
        "b-2.my-msk.abc123.c2.kafka.us-east-1.amazonaws.com:9098",
        "VPC_CIDR": "10.0.0.0/16",
    }


def test_eks_quickstart_renders_with_the_clouds_names(tmp_path: Path) -> None:
    quotes_its_values_file(EKS, "eks-values.yaml")
    values = eks_values()
    docs = render_install(EKS, values)
    cmds = commands(EKS)

    # The role eksctl makes is the one the chart names, for the ServiceAccount it binds.
    sa = only(docs, "ServiceAccount")
    irsa = one(cmds, "eksctl create iamserviceaccount ")
    pod_identity = one(cmds, "eksctl create podidentityassociation ")
    assert flag(irsa, "--namespace") == flag(pod_identity, "--namespace") == ["reclaimd"]
    assert flag(irsa, "--name") == flag(pod_identity, "--service-account-name")
    assert flag(irsa, "--name") == [sa["metadata"]["name"]]
    assert sa["metadata"]["namespace"] == "reclaimd"
    assert flag(one(cmds, "helm install "), "--namespace") == ["reclaimd"]
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == values["ROLE_ARN"]
    assert values["ROLE_ARN"].endswith("role/" + flag(irsa, "--role-name")[0])
    assert flag(irsa, "--role-name") == flag(pod_identity, "--role-name")
    assert flag(irsa, "--attach-policy-arn") == ["POLICY_ARN", "MSK_POLICY_ARN"]
    assert flag(pod_identity, "--permission-policy-arns") == ["POLICY_ARN,MSK_POLICY_ARN"]
    deployment = only(docs, "Deployment", "reclaimd")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["containers"][0]["image"] == f"{values['IMAGE']}:{values['TAG']}"

    settings = settings_of(only(docs, "ConfigMap"), tmp_path)
    assert settings.sqs.enabled and settings.sqs.queue_url == values["QUEUE_URL"]
    assert settings.sqs.queue_url.endswith("/reclaimd-interruptions")
    assert settings.ledger.bootstrap == values["BOOTSTRAP"]
    assert settings.cluster_name == values["CLUSTER"]
    assert settings.kafka.security_protocol == "SASL_SSL"
    assert settings.kafka.sasl is not None
    assert settings.kafka.sasl.mechanism == "OAUTHBEARER"
    assert settings.kafka.sasl.msk_iam_region == values["REGION"]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert any(values["VPC_CIDR"] in yaml.safe_dump(p) for p in policies)

    # The drill checks the release the page installed.
    drill = one(cmds, ".venv/bin/reclaimd drill run ")
    assert flag(drill, "--release") == ["reclaimd"]
    assert flag(drill, "--release-namespace") == ["reclaimd"]
    assert "--cluster" in drill.split() and "--dry-run" in drill.split()
    scenario = drill.split()[3]
    assert (REPO / scenario).is_file()
    assert "source: ec2-sqs" in (REPO / scenario).read_text()


def test_eks_pod_identity_variant_reaches_the_agent(tmp_path: Path) -> None:
    """The page's Pod Identity variant: no role annotation, the agent's address in egress."""
    page = EKS.read_text()
    (variant,) = re.findall(r"^#\s+(--set-json 'networkPolicy\.metadata=.*')$", page, re.M)
    original = EKS.read_text()
    install = one(commands(EKS), "helm install ")
    role_flag = '--set serviceAccount.awsRoleArn="$ROLE_ARN"'
    assert role_flag in install
    swapped = original.replace(role_flag + " \\\n", variant + " \\\n")
    assert swapped != original
    tmp_page = tmp_path / "quickstart-eks-pod-identity.md"
    tmp_page.write_text(swapped)
    docs = render_install(tmp_page, eks_values())
    sa = only(docs, "ServiceAccount")
    assert "eks.amazonaws.com/role-arn" not in (sa["metadata"].get("annotations") or {})
    egress = yaml.safe_dump([d for d in docs if d["kind"] == "NetworkPolicy"])
    assert "169.254.170.23/32" in egress and "169.254.169.254/32" in egress


# --- GKE ---------------------------------------------------------------------------------------


def gke_values() -> dict[str, str]:
    page = assignments(GKE)
    outputs = tf_blocks("output")
    for var, out in (("GSA", "gsa_email"), ("SUBSCRIPTION", "subscription")):
        assert page[var] == f"$(terraform -chdir=deploy/gcp output -raw {out})", var
        assert out in outputs, f"main.tf has no output {out}"
    assert "value       = local.gsa_email" in outputs["gsa_email"]
    assert "value       = var.name" in outputs["subscription"]
    project = literal(page, "PROJECT")
    # Unless reclaimd_gsa_email is given, main.tf creates <gsa_account_id>@<project>.
    assert tf_default("reclaimd_gsa_email") == ""
    assert 'resource "google_service_account" "reclaimd"' in TF.read_text()
    return {
        "PROJECT": project,
        "CLUSTER": literal(page, "CLUSTER"),
        "IMAGE": literal(page, "IMAGE"),
        "TAG": literal(page, "TAG"),
        "GSA": f"{tf_default('gsa_account_id')}@{project}.iam.gserviceaccount.com",
        "SUBSCRIPTION": tf_default("name"),
        "BOOTSTRAP": literal(page, "BOOTSTRAP"),
        "KAFKA_CIDR": literal(page, "KAFKA_CIDR"),
    }


def test_gke_quickstart_renders_with_the_clouds_names(tmp_path: Path) -> None:
    quotes_its_values_file(GKE, "gke-values.yaml")
    values = gke_values()
    docs = render_install(GKE, values)
    cmds = commands(GKE)
    assert "-var project=PROJECT" in one(cmds, "terraform -chdir=deploy/gcp apply").replace(
        '"', ""
    ).replace("$", "")

    sa = only(docs, "ServiceAccount")
    ns, name = tf_default("workload_identity_ksa").split("/")
    assert (sa["metadata"]["namespace"], sa["metadata"]["name"]) == (ns, name)
    assert flag(one(cmds, "helm install "), "--namespace") == [ns]
    assert sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == values["GSA"]
    assert values["GSA"] == "reclaimd@my-project.iam.gserviceaccount.com"
    secret = one(cmds, "kubectl -n reclaimd create secret generic ")
    gke_file = yaml.safe_load((REPO / "docs" / "quickstart" / "gke-values.yaml").read_text())
    assert secret.split()[6] == gke_file["kafka"]["sasl"]["passwordSecret"]["name"]

    deployment = only(docs, "Deployment", "reclaimd")
    assert deployment["spec"]["replicas"] == tf_default("replicas")
    cm = only(docs, "ConfigMap")
    kafka = yaml.safe_load(cm["data"]["config.yaml"])["kafka"]
    assert kafka["security_protocol"] == "SASL_SSL"
    assert kafka["sasl"]["mechanism"] == "SCRAM-SHA-512"
    assert kafka["sasl"]["username"] == "reclaimd"
    # The password file is the mounted Secret's: not here, so the rest is checked without it.
    without = yaml.safe_load(cm["data"]["config.yaml"])
    del without["kafka"]
    settings = settings_of({"data": {"config.yaml": yaml.safe_dump(without)}}, tmp_path)
    assert settings.pubsub.enabled
    assert settings.pubsub.project == values["PROJECT"]
    assert settings.pubsub.subscription == values["SUBSCRIPTION"] == "reclaimd-preemptions"
    assert settings.pubsub.slots == tf_default("replicas")  # one subscription per replica
    assert settings.ledger.bootstrap == values["BOOTSTRAP"]
    assert settings.cluster_name == values["CLUSTER"]
    mounted = yaml.safe_dump(deployment)
    assert "reclaimd-kafka" in mounted  # the password Secret, as a file

    drill = one(cmds, ".venv/bin/reclaimd drill run ")
    assert flag(drill, "--release") == ["reclaimd"]
    assert flag(drill, "--release-namespace") == [ns]
    scenario = drill.split()[3]
    assert "source: gke-pubsub" in (REPO / scenario).read_text()


# --- one name everywhere -----------------------------------------------------------------------


MARKDOWN = [
    REPO / "README.md",
    REPO / "deploy" / "aws" / "README.md",
    REPO / "deploy" / "gcp" / "README.md",
    REPO / "deploy" / "helm" / "reclaimd" / "README.md",
    EKS,
    GKE,
]


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_page_names_the_stacks_queue_and_role(page: Path) -> None:
    text = page.read_text()
    queue = cfn()["Parameters"]["QueueName"]["Default"]
    for url in re.findall(r"https://sqs\.[\w.-]+/\d+/[\w-]+", text):
        assert url.endswith("/" + queue), f"{page.name}: {url} is not the stack's queue"
    for cmd in re.findall(r"eksctl create iamserviceaccount[^`]*?--approve", text, re.S):
        assert "--role-name reclaimd" in cmd, f"{page.name}: eksctl names no role: {cmd}"
    for arn in re.findall(r"arn:aws:iam::\d+:role/[\w-]+", text):
        assert arn.endswith(":role/reclaimd"), f"{page.name}: {arn}"
    for gsa in re.findall(r"[\w-]+@[\w<>-]+\.iam\.gserviceaccount\.com", text):
        assert gsa.startswith("reclaimd@"), f"{page.name}: {gsa}"
