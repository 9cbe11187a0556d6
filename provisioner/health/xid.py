"""NVIDIA's XID catalogue: XID → (mnemonic, description, NVIDIA's immediate resolution) → our
class and recommended action.

Source: NVIDIA, "XID Errors — XID Catalog" (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
sheet "Catalog", columns Mnemonic, Description, Immediate Resolution), as machine-read on
2025-10-29 into leptonai/gpud ``components/accelerator/nvidia/xid/catalog_generated.go``
(commit b9842de2b11177a482560391805f1691c9ef9607, Apache-2.0). The XIDs the catalogue marks
"Unused" are left out: an XID not here is classed ``gpu``/``drain`` (unknown, look at it).

NVIDIA's resolution vocabulary → our action (``_RESOLUTION``): ``IGNORE``, ``RESTART_APP``
and ``CHECK_APP/CUDA`` → ``none``; ``RESET_GPU`` → ``reset_gpu``; ``RESTART_BM`` (restart
bare metal) and ``RESTART_VM`` → ``restart_os``; ``UPDATE_SWFW`` → ``reimage``;
``CHECK_MECHANICALS`` and ``CONTACT_SUPPORT`` → ``service_required``. The workflows are
read as their first step: ``WORKFLOW_XID_48`` (a DBE: reset so the row remap applies) and
``WORKFLOW_NVLINK_ERR``/``WORKFLOW_NVLINK5_ERR`` (fatal link errors need a GPU reset; a line
that says ``Nonfatal`` is recorded only) → ``reset_gpu``; ``WORKFLOW_XID_45`` ("follow the
other Xid") → ``none``; ``XID_154`` → the recovery action the line names. XIDs 162-172 have
no resolution in that sheet: ours are marked ``# ours`` below.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.health.model import Action, HealthClass

C = HealthClass
CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOG_VERSION = "XID Catalog as read 2025-10-29 (leptonai/gpud b9842de2)"


@dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    mnemonic: str
    description: str
    resolution: str        # NVIDIA's "Immediate Resolution", verbatim
    cls: HealthClass

    @property
    def action(self) -> Action:
        return _OURS.get(self.code) or _RESOLUTION.get(self.resolution, Action.DRAIN)


_RESOLUTION: dict[str, Action] = {
    "IGNORE": Action.NONE,
    "RESTART_APP": Action.NONE,
    "CHECK_APP/CUDA": Action.NONE,
    "CHECK_UVM": Action.NONE,
    "WORKFLOW_XID_45": Action.NONE,
    "RESET_GPU": Action.RESET_GPU,
    "WORKFLOW_XID_48": Action.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": Action.RESET_GPU,
    "WORKFLOW_NVLINK5_ERR": Action.RESET_GPU,
    "RESTART_BM": Action.RESTART_OS,
    "RESTART_VM": Action.RESTART_OS,
    "UPDATE_SWFW": Action.REIMAGE,
    "CHECK_MECHANICALS": Action.SERVICE_REQUIRED,
    "CONTACT_SUPPORT": Action.SERVICE_REQUIRED,
}

#: NVIDIA's resolution names as actions (an alert's ``action`` label may use them)
RESOLUTION_ACTIONS = _RESOLUTION

# XIDs whose sheet row has no immediate resolution (162-172): our reading of the description
_OURS: dict[int, Action] = {
    162: Action.NONE, 163: Action.NONE, 164: Action.NONE,  # power smoothing: informational
    165: Action.SERVICE_REQUIRED,                          # power smoothing lifetime exhausted
    166: Action.RESET_GPU, 167: Action.RESTART_OS, 168: Action.RESET_GPU,
    169: Action.RESET_GPU, 170: Action.NONE, 171: Action.RESET_GPU, 172: Action.RESET_GPU,
}

# shorthands of the table below: classes, NVIDIA's commonest resolutions, and the mnemonic
# prefix RC_ (NVIDIA's ROBUST_CHANNEL_, expanded by ``XidEntry.mnemonic``)
APP, MEM, LOST, NVL, DRV, PWR, GPU = (C.APPLICATION, C.GPU_MEMORY, C.GPU_LOST, C.NVLINK,
                                      C.DRIVER, C.POWER, C.GPU)
RA, IG, RG = "RESTART_APP", "IGNORE", "RESET_GPU"

_ROWS: tuple[tuple[int, str, str, str, HealthClass], ...] = (
    (8, "RC_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", RA, APP),
    (11, "RC_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", RA, APP),
    (13, "RC_GR_EXCEPTION", "Graphics Engine Exception", RA, APP),
    (14, "RC_FAKE_ERROR", "Unused", IG, APP),
    (25, "RC_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", RA, APP),
    (31, "RC_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", RA, APP),
    (32, "RC_PBDMA_ERROR", "Invalid or corrupted push buffer stream", RA, APP),
    (37, "RC_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", IG, DRV),
    (38, "RC_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", IG, DRV),
    (39, "RC_CE0_ERROR", "Copy Engine Exception", RA, APP),
    (40, "RC_CE1_ERROR", "Copy Engine Exception", RA, APP),
    (41, "RC_CE2_ERROR", "Copy Engine Exception", RA, APP),
    (43, "RC_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", IG, APP),
    (44, "RC_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", IG, APP),
    (45, "RC_PREEMPTIVE_REMOVAL",
     "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45", APP),
    (46, "RC_GPU_TIMEOUT_ERROR", "GPU stopped processing", RG, GPU),
    (48, "RC_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48", MEM),
    (54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING",
     "Auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS", PWR),
    (60, "RC_SEC2_ERROR", "Video processor exception", RA, APP),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt", RG, GPU),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", IG, MEM),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", RG, MEM),
    (66, "RC_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", IG, DRV),
    (67, "RC_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", IG, DRV),
    (68, "RC_NVDEC0_ERROR", "NVDEC0 Exception", RA, APP),
    (69, "RC_GR_CLASS_ERROR", "Graphics Engine class error", RA, APP),
    (74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", NVL),
    (78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW", DRV),
    (79, "RC_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM", LOST),
    (80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", RA, APP),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", IG, MEM),
    (93, "INFOROM_ERASE_LIMIT_EXCEEDED",
     "Non-fatal violation of provisioned InfoROM wear limit", IG, GPU),
    (94, "RC_CONTAINED_ERROR", "Contained memory error", RA, MEM),
    (95, "RC_UNCONTAINED_ERROR", "Uncontained memory error", RG, MEM),
    (106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", IG, APP),
    (107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", IG, APP),
    (108, "NVLINK_REMOTE_TRANSLATION_ERROR", "Unused", IG, NVL),
    (109, "RC_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", RG, GPU),
    (110, "SEC_FAULT_ERROR", "Security Fault Error", RG, GPU),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", RG, GPU),
    (120, "GSP_ERROR", "GSP Error", RG, GPU),
    (121, "C2C_ERROR", "C2C Error", IG, GPU),
    (136, "ALI_TRAINING_FAIL", "Link Training Failed", RG, NVL),
    (137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", IG, NVL),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", RG, MEM),
    (141, "RC_FAST_PATH_ERROR", "CUDA Fast Path Error", IG, APP),
    (142, "RC_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT", GPU),
    (143, "GPU_INIT_ERROR", "GPU Initialization Error", RG, GPU),
    (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error", "WORKFLOW_NVLINK5_ERR", NVL),
    (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR", NVL),
    (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error", "WORKFLOW_NVLINK5_ERR", NVL),
    (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error", "WORKFLOW_NVLINK5_ERR", NVL),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error", "WORKFLOW_NVLINK5_ERR", NVL),
    (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error", "WORKFLOW_NVLINK5_ERR", NVL),
    (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error", "WORKFLOW_NVLINK5_ERR", NVL),
    (151, "RC_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM", DRV),
    (152, "RC_DLA_SMMU_ERROR", "DLA SMMU Error", IG, APP),
    (153, "RC_DLA_TIMEOUT", "DLA timeout Error", IG, APP),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154", GPU),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", RG, NVL),
    (156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", RG, MEM),
    (157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", IG, MEM),
    (158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", RG, GPU),
    (159, "RC_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM", GPU),
    (160, "CHANNEL_RETIREMENT_EVENT", "Channel Retirement Event", IG, GPU),
    (161, "CHANNEL_RETIREMENT_FAILURE", "Channel Retirement Failure", IG, GPU),
    (162, "PSHC_REENGAGED", "Power Smoothing HW Circuitry capability reengaged", "", PWR),
    (163, "PSHC_DISENGAGED", "Power Smoothing HW Circuitry capability disengaged", "", PWR),
    (164, "PSHC_LOW_LIFETIME", "Power Smoothing HW Circuitry low lifetime reached", "", PWR),
    (165, "PSHC_ZERO_LIFETIME", "Power Smoothing HW Circuitry lifetime exhausted", "", PWR),
    (166, "NVLINK_SECURE_CRYPTO_ERR",
     "CC traffic seen before the link was configured for encryption", "", NVL),
    (167, "PCIE_FATAL_TIMEOUT", "PCIE_FATAL_TIMEOUT", "", GPU),
    (168, "REDUCED_GPU_MEMORY_CAPACITY", "Errors found in WPR (write protected region)", "", MEM),
    (169, "SEC2_HALT_ERROR", "Internal micro-controller halt", "", GPU),
    (170, "NVLINK_SECURE_OTHER", "Interrupt seen in CC mode", "", NVL),
    (171, "UNCORRECTABLE_DRAM_ERROR", "Additional to Xid 48: the fault is in DRAM", "", MEM),
    (172, "UNCORRECTABLE_SRAM_ERROR", "Additional to Xid 48: the fault is in SRAM", "", MEM),
)

CATALOG: dict[int, XidEntry] = {
    row[0]: XidEntry(row[0], row[1].replace("RC_", "ROBUST_CHANNEL_", 1), *row[2:])
    for row in _ROWS}
# the copy-engine, NVDEC, NVJPG and OFA exceptions (CE3-CE19, NVDEC1-7, NVJPG0-7, OFA0-1):
# all "RESTART_APP" in the sheet, an exception of one application
for _code in (*range(70, 78), *range(82, 90), *range(96, 106), *range(126, 136), 139):
    if _code not in CATALOG and _code not in (73, 74, 78, 87):
        CATALOG[_code] = XidEntry(_code, "ROBUST_CHANNEL_ENGINE_ERROR", "Engine exception",
                                  "RESTART_APP", C.APPLICATION)

# XID 154 names the recovery action the driver now wants, e.g. "GPU recovery action changed
# from 0x0 (None) to 0x1 (GPU Reset Required)"; the catalogue's values
RECOVERY_ACTIONS: dict[str, Action] = {
    "none": Action.NONE,
    "gpu reset required": Action.RESET_GPU,
    "node reboot required": Action.RESTART_OS,
    "drain p2p": Action.DRAIN,
    "drain and reset": Action.RESET_GPU,
}


def recovery_action(text: str) -> Action | None:
    """The action a ``GPU Recovery Action`` value or XID 154 message names, if it names one."""
    lowered = text.lower()
    found = [action for name, action in RECOVERY_ACTIONS.items()
             if name != "none" and name in lowered]
    if found:
        return max(found, key=lambda a: a.rank)
    return Action.NONE if lowered.strip() in ("none", "0x0 (none)") else None


def lookup(code: int) -> XidEntry:
    entry = CATALOG.get(code)
    if entry is not None:
        return entry
    return XidEntry(code, "UNKNOWN", "not in NVIDIA's XID catalogue", "", C.GPU)
