"""Checks that the deployment files agree with each other and with the README's setup:
the Kubernetes MPIJob (image, command, GPUs, shared checkpoint volume, job ConfigMap), the
Slurm batch script (one task per GPU, requeue, signal) and the Dockerfiles (packages, entry
point, GPU settings). Needs PyYAML (Debian's python3-yaml); exit 77 when it is missing.
Usage: check_manifests.py REPO_ROOT"""
import os
import re
import shlex
import sys

try:
    import yaml
except ImportError:
    print("SKIP: python3 has no yaml module (apt-get install python3-yaml)")
    sys.exit(77)

README_PACKAGES = ["libtorch-dev", "libopenmpi-dev", "openmpi-bin", "libspdlog-dev",
                   "libyaml-cpp-dev", "libgtest-dev", "cmake", "g++", "make", "git", "python3"]
errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)
    return cond


def under(path, root):
    path, root = os.path.normpath(path), os.path.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def readme_packages(root):
    """Packages of the README's `apt-get install` line, or the known list without a README."""
    path = os.path.join(root, "README.md")
    if not os.path.exists(path):
        return README_PACKAGES
    text = open(path).read().replace("\\\n", " ")
    for line in text.splitlines():
        if "apt-get install" in line or "apt install" in line:
            words = line.split("install", 1)[1].split()
            pkgs = [w for w in words if re.match(r"^[a-z0-9][a-z0-9.+-]+$", w)]
            if pkgs:
                return pkgs
    return README_PACKAGES


def launcher_flags(root):
    """The options thetad-launch's usage (--help) lists: usage_text() in launch/options.cpp."""
    text = open(os.path.join(root, "launch/options.cpp")).read()
    usage = text[text.index("usage: thetad-launch"):text.index("EOF", text.index("usage: thetad-launch"))]
    return set(re.findall(r"^\s+(--[a-z][a-z-]*)", usage, re.M))


def check_mpijob(root):
    docs = list(yaml.safe_load_all(open(os.path.join(root, "deploy/k8s/mpijob.yaml"))))
    kinds = {d["kind"]: d for d in docs if d}
    if not check("MPIJob" in kinds, "mpijob.yaml: no MPIJob"):
        return
    job = kinds["MPIJob"]
    check(job.get("apiVersion") == "kubeflow.org/v2beta1", "MPIJob apiVersion is not kubeflow.org/v2beta1")
    spec = job["spec"]
    slots = spec.get("slotsPerWorker")
    check(isinstance(slots, int) and slots > 0, "slotsPerWorker missing")
    reps = spec["mpiReplicaSpecs"]
    launcher = reps["Launcher"]["template"]["spec"]
    worker = reps["Worker"]["template"]["spec"]
    lc, wc = launcher["containers"][0], worker["containers"][0]

    check(lc["image"] == wc["image"], f"images differ: launcher {lc['image']} worker {wc['image']}")

    cmd = [str(x) for x in lc.get("command", []) + lc.get("args", [])]
    check(any("thetad" in os.path.basename(c) for c in cmd), f"launcher command does not run thetad: {cmd}")
    if any(c.endswith("thetad-launch") for c in cmd):
        # Every launcher option the MPIJob passes (those before the job file) is one the
        # launcher's usage lists: a renamed or removed flag fails here, not in a cluster.
        known = launcher_flags(root)
        job_at = next((i for i, c in enumerate(cmd) if c.endswith((".yaml", ".yml"))), len(cmd))
        for c in cmd[1:job_at]:
            if c.startswith("--") and c != "--":
                check(c.split("=")[0] in known, f"MPIJob launcher flag {c} is not a thetad-launch option ({sorted(known)})")
        if "--nproc-per-node" in cmd:
            n = int(cmd[cmd.index("--nproc-per-node") + 1])
            check(n == slots, f"--nproc-per-node {n} != slotsPerWorker {slots}")
        else:
            errors.append("thetad-launch in the launcher needs --nproc-per-node (the launcher pod has no GPUs)")
    elif "-np" in cmd:
        np_ = int(cmd[cmd.index("-np") + 1])
        check(np_ == slots * reps["Worker"]["replicas"], f"-np {np_} != workers x slotsPerWorker")

    gpus = wc.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    check(gpus is not None and int(gpus) == slots, f"worker nvidia.com/gpu {gpus} != slotsPerWorker {slots}")

    def mounts(pod, container, pred):
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])
                if m["name"] in vols and pred(vols[m["name"]])}

    is_pvc = lambda v: "persistentVolumeClaim" in v
    is_cm = lambda v: "configMap" in v
    lp, wp = mounts(launcher, lc, is_pvc), mounts(worker, wc, is_pvc)
    shared = None
    if check(lp and wp, "a shared PVC must be mounted in launcher and workers"):
        lpath, wpath = sorted(lp.values())[0], sorted(wp.values())[0]
        check(lpath == wpath, f"shared volume mounted at {lpath} (launcher) but {wpath} (worker)")
        lclaims = {v["persistentVolumeClaim"]["claimName"] for v in launcher["volumes"] if is_pvc(v)}
        wclaims = {v["persistentVolumeClaim"]["claimName"] for v in worker["volumes"] if is_pvc(v)}
        check(lclaims == wclaims, f"launcher and workers use different claims: {lclaims} {wclaims}")
        shared = wpath

    # The job file: a ConfigMap mounted at the same path in both; the path is in the command.
    lcm, wcm = mounts(launcher, lc, is_cm), mounts(worker, wc, is_cm)
    check(lcm and wcm and sorted(lcm.values()) == sorted(wcm.values()),
          "the job ConfigMap must be mounted at the same path in launcher and workers")
    cm_name = next((v["configMap"]["name"] for v in launcher.get("volumes", []) if is_cm(v)), None)
    job_args = [c for c in cmd if c.endswith((".yaml", ".yml"))]
    if check(job_args, "launcher command names no job file"):
        jpath = job_args[-1]
        mdir = next((p for p in lcm.values() if under(jpath, p)), None)
        if check(mdir is not None, f"job file {jpath} is not in the ConfigMap mount"):
            key = os.path.relpath(jpath, mdir)
            cm = kinds.get("ConfigMap")
            if check(cm is not None and cm["metadata"]["name"] == cm_name and key in cm.get("data", {}),
                     f"ConfigMap {cm_name} with key {key} not in mpijob.yaml"):
                jobcfg = yaml.safe_load(cm["data"][key])
                ckpt = (jobcfg.get("checkpoint") or {}).get("dir", "")
                check(ckpt and shared and os.path.isabs(ckpt) and under(ckpt, shared),
                      f"checkpoint.dir '{ckpt}' is not under the shared volume '{shared}'")
                if "--log-dir" in cmd and shared:
                    check(under(cmd[cmd.index("--log-dir") + 1], shared), "--log-dir is not on the shared volume")

    envs = {e["name"]: e.get("value") for c in (lc, wc) for e in c.get("env", [])}
    check(envs.get("NCCL_NVLS_ENABLE") == "0", "NCCL_NVLS_ENABLE=0 missing from the MPIJob env")


def sbatch_opts(text):
    opts = {}
    for line in text.splitlines():
        m = re.match(r"^#SBATCH\s+(.*)$", line)
        if not m:
            continue
        for word in shlex.split(m.group(1), comments=True):
            if word.startswith("--"):
                k, _, v = word[2:].partition("=")
                opts[k] = v if v else True
    return opts


def check_sbatch(root):
    text = open(os.path.join(root, "deploy/slurm/thetad.sbatch")).read()
    o = sbatch_opts(text)
    tpn = int(o.get("ntasks-per-node", 0))
    check(tpn > 0, "sbatch: no --ntasks-per-node")
    if "gpus-per-node" in o:
        gpn = int(str(o["gpus-per-node"]).split(":")[-1])
    elif "gres" in o and str(o["gres"]).startswith("gpu"):
        gpn = int(str(o["gres"]).split(":")[-1])
    else:
        gpn = tpn * int(o.get("gpus-per-task", 0))
    check(gpn == tpn, f"sbatch: ntasks-per-node {tpn} != GPUs per node {gpn}")
    if "gpus-per-task" in o:
        check(int(o["gpus-per-task"]) == 1, "sbatch: want --gpus-per-task=1")
    if "ntasks" in o and "nodes" in o:
        check(int(o["ntasks"]) == int(o["nodes"]) * tpn, "sbatch: ntasks != nodes x ntasks-per-node")
    check(o.get("requeue") is True, "sbatch: no --requeue")
    check(re.match(r"^B:TERM@\d+$", str(o.get("signal", ""))), "sbatch: want --signal=B:TERM@<seconds>")
    check("scontrol requeue" in text, "sbatch: no scontrol requeue")
    check(re.search(r"\(\(\s*rc\s*==\s*4\s*\)\)", text), "sbatch: does not requeue on exit code 4")
    check(re.search(r"trap .*TERM", text), "sbatch: does not trap TERM")
    check("thetad-launch" in text, "sbatch: does not start thetad-launch")


def check_dockerfiles(root, pkgs):
    for name, gpu in (("Dockerfile.cpu", False), ("Dockerfile.gpu", True)):
        text = open(os.path.join(root, "deploy/docker", name)).read()
        flat = text.replace("\\\n", " ")
        installs = " ".join(line for line in flat.splitlines() if "apt-get install" in line)
        words = set(installs.split())
        for p in pkgs:
            if gpu and p == "libtorch-dev":
                continue  # the GPU image uses PyTorch's LibTorch
            check(p in words, f"{name}: README package {p} not installed")
        check(re.search(r"cmake -S \. -B \S+", flat) and "cmake --build" in flat, f"{name}: no CMake build")
        check(re.search(r'ENTRYPOINT \[?"?\S*launch/thetad-launch', text), f"{name}: ENTRYPOINT is not thetad-launch")
        if gpu:
            check(re.search(r"^FROM\s+\S*nvidia/cuda:\S*devel", flat, re.M) or "nvidia/cuda:" in flat and "devel" in flat,
                  f"{name}: not on an nvidia/cuda devel base")
            check("CUDAARCHS=90" in flat, f"{name}: CUDAARCHS=90 missing")
            check("NCCL_NVLS_ENABLE=0" in flat, f"{name}: NCCL_NVLS_ENABLE=0 missing")
            check("CMAKE_PREFIX_PATH" in flat and "cmake_prefix_path" in flat,
                  f"{name}: LibTorch not given to CMake via CMAKE_PREFIX_PATH")
        else:
            check(re.search(r"^FROM\s+debian:12", flat, re.M), f"{name}: not on debian:12")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
    check_mpijob(root)
    check_sbatch(root)
    check_dockerfiles(root, readme_packages(root))
    for e in errors:
        print("FAIL:", e)
    if not errors:
        print("ok: deploy/ manifests agree (MPIJob, sbatch, Dockerfiles)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
