#!/usr/bin/python
"""Ansible module: a node's hardware facts in the shape of provisioner's agent reports.

Runs on the node with its own Python (standard library only). Reads DMI, /proc, /sys and
``nvidia-smi -q -x`` (when the driver is up; the report carries it verbatim for the validation
gate and the live topology), and runs ``dcgmi diag -r 1`` when DCGM is installed (a quick,
non-destructive diagnostic); changes nothing.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

from ansible.module_utils.basic import AnsibleModule

try:  # Ansible ships the role's module_utils with the module
    from ansible.module_utils.provisioner_dcgm import judge_dcgm
    from ansible.module_utils.provisioner_gpu_ids import device_hex, model_name
except ImportError:  # run as a plain script (tests): the same files, next to this library
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "module_utils"))
    from provisioner_dcgm import judge_dcgm
    from provisioner_gpu_ids import device_hex, model_name

DOCUMENTATION = r"""
module: provisioner_node_facts
short_description: >-
  Hardware facts (nvidia-smi -q -x, InfiniBand, NICs, disks) as an agent report
options:
  nvidia_smi:
    description: nvidia-smi to run; missing or failing means GPUs come from PCI only.
    type: str
    default: nvidia-smi
  extra_interfaces:
    description: Interfaces reported although virtual (bonds, test dummies).
    type: list
    elements: str
    default: []
  dcgmi:
    description: dcgmi to run `dcgmi diag -r 1 -j` with; missing means no dcgm_diag in the report.
    type: str
    default: dcgmi
  dcgm_diag:
    description: Run the DCGM diagnostic when dcgmi is present.
    type: bool
    default: true
  dcgm_timeout_s:
    description: Seconds `dcgmi diag` may take.
    type: int
    default: 600
  dcgm_level:
    description: The diagnostic level, `dcgmi diag -r <level>` (1 quick, 2 medium, 3 long).
    type: int
    default: 1
    choices: [1, 2, 3]
  systemctl:
    description: >-
      systemctl to ask for nvidia-imex and nvidia-fabricmanager; missing means no imex in
      the report.
    type: str
    default: systemctl
  imex_binary:
    description: The IMEX daemon whose presence means the IMEX package is installed.
    type: str
    default: nvidia-imex
"""

MAX_ITEMS = 512
MAX_XML_BYTES = 8 << 20  # provisioner.agent.facts.MAX_NVIDIA_SMI_XML_BYTES
MAX_SUMMARY = 4000
NVIDIA = "0x10de"
MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def read(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return default


def system():
    dmi = "/sys/class/dmi/id/"
    values = {"vendor": read(dmi + "sys_vendor")[:256], "model": read(dmi + "product_name")[:256],
              "serial": read(dmi + "product_serial")[:128], "uuid": read(dmi + "product_uuid")[:64]}
    if values["serial"].lower() in ("", "na", "n/a", "none", "not specified",
                                    "to be filled by o.e.m.", "0123456789"):
        values["serial"] = ""
    return values


def cpu():
    model, sockets, cores = "", set(), set()
    physical = "0"
    for line in read("/proc/cpuinfo").splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and not model:
            model = value
        elif key == "physical id":
            physical = value
            sockets.add(value)
        elif key == "core id":
            cores.add((physical, value))
    threads = os.cpu_count() or 1
    return {"model": model[:256], "sockets": max(1, min(len(sockets), 64)),
            "cores": max(1, min(len(cores) or threads, 4096)), "threads": min(threads, 4096),
            "arch": platform.machine()[:32]}


def memory_mib():
    match = re.search(r"^MemTotal:\s+(\d+) kB", read("/proc/meminfo"), re.M)
    return max(1, int(match.group(1)) // 1024) if match else 1


def nics(extra):
    found = []
    for path in sorted(glob.glob("/sys/class/net/*"))[:MAX_ITEMS]:
        name = os.path.basename(path)
        physical = os.path.exists(os.path.join(path, "device"))
        mac = read(os.path.join(path, "address")).lower()
        if name == "lo" or not (physical or name in extra) or not MAC_RE.match(mac):
            continue
        nic = {"name": name, "mac": mac, "link": read(os.path.join(path, "operstate")) == "up"}
        driver = os.path.join(path, "device", "driver")
        if os.path.islink(driver):
            nic["driver"] = os.path.basename(os.readlink(driver))[:64]
        speed = read(os.path.join(path, "speed"), "-1")
        if speed.lstrip("-").isdigit() and 0 <= int(speed) <= 10_000_000:
            nic["speed_mbps"] = int(speed)
        found.append(nic)
    return found


def disks():
    found = []
    for path in sorted(glob.glob("/sys/block/*"))[:MAX_ITEMS]:
        name = os.path.basename(path)
        if re.match(r"^(loop|ram|dm-|zram|sr|md|nbd)", name):
            continue
        size = read(os.path.join(path, "size"), "0")
        disk = {"name": name[:64], "size_bytes": int(size) * 512 if size.isdigit() else 0,
                "rotational": read(os.path.join(path, "queue", "rotational")) == "1"}
        for key, source in (("model", "device/model"), ("serial", "device/serial"),
                            ("wwn", "device/wwid")):
            value = read(os.path.join(path, source))
            if value:
                disk[key] = value[:128]
        found.append(disk)
    return found


LOST = re.compile(r"(Unable to determine the device handle for GPU.*|.*GPU is lost.*)$", re.M)


def gpus_from_nvidia_smi(binary):
    """(gpus, nvidia info, XML, error lines) from ``nvidia-smi -q -x``; (None, {}, None, [])
    when it cannot run or prints no report. A GPU the driver lost is missing from the report
    and named in a line such as ``Unable to determine the device handle for GPU
    0000:05:00.0: GPU is lost. Reboot the system to recover this GPU`` (on stdout or stderr,
    with a non-zero exit status): those lines are kept for the validation gate. The XML is
    None when larger than provisioner accepts."""
    path = shutil.which(binary)
    if path is None:
        return None, {}, None, []
    try:
        proc = subprocess.run([path, "-q", "-x"], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None, {}, None, []
    errors = [" ".join(line.split())[:512] for line in
              LOST.findall(proc.stdout + "\n" + proc.stderr)][:MAX_ITEMS]
    start = proc.stdout.find("<?xml")
    start = proc.stdout.find("<nvidia_smi_log") if start < 0 else start
    out = proc.stdout[start:] if start >= 0 else ""
    try:
        root = ET.fromstring(out)
    except (ET.ParseError, ValueError):
        return None, {}, None, errors
    gpus = [gpu_entry(gpu) for gpu in root.findall("gpu")[:MAX_ITEMS]]
    info = {"driver_version": (root.findtext("driver_version") or "").strip(),
            "cuda_version": (root.findtext("cuda_version") or "").strip(),
            "count": len(gpus)}
    if len(out.encode()) > MAX_XML_BYTES:
        info["xml_omitted"] = f"larger than {MAX_XML_BYTES} bytes"
        return gpus, info, None, errors
    return gpus, info, out, errors


def gpu_entry(gpu):
    """One ``<gpu>``: its device ID from ``pci/pci_device_id`` (``0x233010DE`` in DTD v12,
    ``233010DE`` without ``0x`` from driver 580 on; device in the high 16 bits) and its product
    name (the table's when nvidia-smi gives none)."""
    device = device_hex(gpu.findtext("pci/pci_device_id") or "") or "0x0000"
    name = (gpu.findtext("product_name") or "").strip()[:256]
    return {"pci_address": pci_address(gpu.get("id", "")), "vendor": NVIDIA, "device": device,
            "name": name or model_name(device)}


def dcgm_diag(binary, timeout_s, level=1):
    """``dcgmi diag -r <level> -j`` judged here: {"ran", "passed", "summary", "level"}; None
    without dcgmi."""
    path = shutil.which(binary)
    if path is None:
        return None
    command = f"dcgmi diag -r {level}"
    try:
        proc = subprocess.run([path, "diag", "-r", str(level), "-j"], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ran": False, "passed": False, "level": level,
                "summary": f"{command} timed out after {timeout_s} s"}
    except (OSError, ValueError) as exc:
        return {"ran": False, "passed": False, "level": level,
                "summary": f"dcgmi cannot run: {exc}"[:MAX_SUMMARY]}
    return dict(judge_dcgm(proc.returncode, proc.stdout, proc.stderr), level=level)


def unit_state(systemctl, unit):
    """(``is-enabled``, ``is-active``) of a systemd unit: ``masked``/``enabled``/...,
    ``active``/``inactive``/...; ``not-found`` for a unit that is not installed."""
    states = []
    for verb in ("is-enabled", "is-active"):
        try:
            proc = subprocess.run([systemctl, verb, unit], capture_output=True, text=True,
                                  timeout=20, check=False)
        except (OSError, subprocess.SubprocessError):
            return "unknown", "unknown"
        word = (proc.stdout.strip().splitlines() or [""])[0].strip()[:32]
        if not word or "not-found" in proc.stderr or "No such file" in proc.stderr:
            word = "not-found" if verb == "is-enabled" else (word or "inactive")
        states.append(word)
    return states[0], states[1]


def imex_facts(systemctl, imex_binary):
    """GB200/GB300 prerequisites: the IMEX package, the host's own ``nvidia-imex`` service
    (masked when the NVIDIA DRA driver runs IMEX in ComputeDomains) and no host Fabric
    Manager. None without systemctl (no way to tell)."""
    path = shutil.which(systemctl)
    if path is None:
        return None
    imex_enabled, imex_active = unit_state(path, "nvidia-imex.service")
    fm_enabled, fm_active = unit_state(path, "nvidia-fabricmanager.service")
    return {"package": shutil.which(imex_binary) is not None,
            "service_enabled": imex_enabled, "service_active": imex_active,
            "fabricmanager_enabled": fm_enabled, "fabricmanager_active": fm_active}


def pci_address(text):
    """``00000000:17:00.0`` -> ``0000:17:00.0`` (sysfs form)."""
    text = text.strip().lower()
    match = re.match(r"^([0-9a-f]+):([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$", text)
    return f"{int(match.group(1), 16):04x}:{match.group(2)}" if match else text[:32]


def nvidia_pci():
    """NVIDIA display and 3D controllers on PCI (the facts schema's ``pci`` entries)."""
    found = []
    for path in sorted(glob.glob("/sys/bus/pci/devices/*"))[:4096]:
        if read(os.path.join(path, "vendor")) != NVIDIA:
            continue
        klass = read(os.path.join(path, "class"))
        if not klass.startswith(("0x0300", "0x0302")):
            continue
        found.append({"address": os.path.basename(path)[:32], "vendor": NVIDIA,
                      "device": read(os.path.join(path, "device"))[:6], "class": klass[:16]})
    return found[:MAX_ITEMS]


def gpus_from_pci(devices):
    """GPUs without a driver, named by model from the device ID table."""
    return [{"pci_address": d["address"], "vendor": d["vendor"], "device": d["device"],
             "name": model_name(d["device"])} for d in devices]


MELLANOX = "0x15b3"
# provisioner.agent.collect's lists: the InfiniBand core and the HCA drivers (providers)
IB_CORE_MODULES = ("ib_core", "ib_uverbs", "ib_umad", "ib_ipoib")
IB_PROVIDERS = ("mlx5_ib", "mlx4_ib", "irdma", "bnxt_re", "hfi1", "ib_qib", "efa", "erdma",
                "qedr", "iw_cxgb4", "ocrdma", "vmw_pvrdma", "mana_ib", "hns_roce_hw_v2",
                "rdma_rxe", "siw")


def infiniband(root="/"):
    """Every /sys/class/infiniband device with its ports, as the ramdisk's collector reads
    them (``link_layer`` included); a field that cannot be read is left out."""
    hcas = []
    for path in sorted(glob.glob(os.path.join(root, "sys/class/infiniband/*")))[:MAX_ITEMS]:
        guid = read(os.path.join(path, "node_guid")).replace(":", "").lower()
        hca = {"device": os.path.basename(path)[:64], "ports": []}
        if re.match(r"^[0-9a-f]{16}$", guid):
            hca["node_guid"] = "0x" + guid
        ports = [p for p in glob.glob(os.path.join(path, "ports", "*"))
                 if os.path.basename(p).isdigit() and 1 <= int(os.path.basename(p)) <= 255]
        for port_path in sorted(ports, key=lambda p: int(os.path.basename(p))):
            hca["ports"].append(ib_port(port_path))
        hcas.append(hca)
    return hcas


def ib_port(path):
    port = {"port": int(os.path.basename(path))}
    state = words(read(os.path.join(path, "state")))
    port["state"] = state[:32] or "unknown"
    phys = words(read(os.path.join(path, "phys_state")))
    if phys:
        port["phys_state"] = phys[:32]
    for key, limit in (("rate", 64), ("link_layer", 32)):
        value = read(os.path.join(path, key))
        if value:
            port[key] = value[:limit]
    lid = read(os.path.join(path, "lid"))
    if re.match(r"^0x[0-9a-fA-F]{1,4}$", lid):
        port["lid"] = int(lid, 16)
    return port


def words(value):
    """``4: ACTIVE`` -> ``ACTIVE``; a bare word is kept."""
    return value.partition(": ")[2].strip() or value


def infiniband_driver(root="/"):
    """Whether an InfiniBand driver is loaded (an HCA driver with the core, or a device
    registered), the IB modules loaded, and the Mellanox network functions on PCI."""
    loaded = sorted(name for name in IB_CORE_MODULES + IB_PROVIDERS
                    if os.path.isdir(os.path.join(root, "sys/module", name)))
    devices = bool(glob.glob(os.path.join(root, "sys/class/infiniband/*")))
    functions = 0
    for dev in glob.glob(os.path.join(root, "sys/bus/pci/devices/*")):
        if read(os.path.join(dev, "vendor")) == MELLANOX and read(
                os.path.join(dev, "class")).startswith("0x02"):
            functions += 1
    return {"loaded": devices or ("ib_core" in loaded
                                  and any(name in IB_PROVIDERS for name in loaded)),
            "modules": loaded, "mellanox_functions": min(functions, 4096)}


def main():
    module = AnsibleModule(
        argument_spec={"nvidia_smi": {"type": "str", "default": "nvidia-smi"},
                       "extra_interfaces": {"type": "list", "elements": "str", "default": []},
                       "dcgmi": {"type": "str", "default": "dcgmi"},
                       "dcgm_diag": {"type": "bool", "default": True},
                       "dcgm_timeout_s": {"type": "int", "default": 600},
                       "dcgm_level": {"type": "int", "default": 1, "choices": [1, 2, 3]},
                       "systemctl": {"type": "str", "default": "systemctl"},
                       "imex_binary": {"type": "str", "default": "nvidia-imex"}},
        supports_check_mode=True)
    gpus, nvidia, xml, smi_errors = gpus_from_nvidia_smi(module.params["nvidia_smi"])
    on_pci = nvidia_pci()
    report = {"system": system(), "cpu": cpu(), "memory_mib": memory_mib(),
              "nics": nics(set(module.params["extra_interfaces"])), "disks": disks(),
              "gpus": gpus if gpus is not None else gpus_from_pci(on_pci),
              "pci": on_pci,  # what is on the bus: the gate sees a GPU the driver lost
              "infiniband": infiniband(), "infiniband_driver": infiniband_driver()}
    if xml is not None:
        report["nvidia_smi_xml"] = xml
    if smi_errors:
        report["nvidia_smi_errors"] = smi_errors
    imex = imex_facts(module.params["systemctl"], module.params["imex_binary"])
    if imex is not None:
        report["imex"] = imex
    if module.params["dcgm_diag"]:
        diag = dcgm_diag(module.params["dcgmi"], module.params["dcgm_timeout_s"],
                         module.params["dcgm_level"])
        if diag is not None:
            report["dcgm_diag"] = diag
    module.exit_json(changed=False, report=report, nvidia=nvidia, driver_up=gpus is not None)


if __name__ == "__main__":
    main()
