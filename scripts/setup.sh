#!/usr/bin/env bash
# Idempotent bootstrap of a Debian 12 host for provisioner's test suite.
#   1. apt-installs the Debian packages the tests start as real peers (only those missing);
#   2. creates a cached virtualenv with `pip install -e ".[test]"` (only when it is missing).
# Prints the virtualenv path as the LAST line of stdout:  VENV=$(bash scripts/setup.sh | tail -1)
# Everything else goes to stderr. Safe without a tty (CI=true, no stdin).
#   --runtime   only what running the daemon on examples/demo.toml needs (scripts/demo.sh):
#               RUNTIME_PACKAGES and a venv with `pip install -e .`; no test peer, no
#               foreign architecture, no Kubernetes peers
#   --dry-run   print the packages and the venv it would set up (stderr), change nothing
set -euo pipefail
RUNTIME=0 DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --runtime) RUNTIME=1 ;;
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: bash scripts/setup.sh [--runtime] [--dry-run]" >&2; exit 2 ;;
  esac
done

# What the daemon itself needs on the demo configuration (SQLite, the fake drivers): the rest
# comes from pip. tests/unit/test_setup_script.py holds it free of test peers.
RUNTIME_PACKAGES=(
  python3
  python3-venv
)

# Debian packages the tests need. Later issues append here (qemu, ipmitool, slurm, ...).
APT_PACKAGES=(
  postgresql-15    # server binaries under /usr/lib/postgresql/15/bin (PEERS.md §11)
  systemd          # systemd-analyze, systemd-sysusers, systemd-tmpfiles
  systemd-container # systemd-nspawn --boot: the Debian package booted under systemd (tests/e2e/test_deb_package.py)
  iproute2
  curl
  ca-certificates
  python3          # a fresh Debian 12 has no python3; harmless when pyenv provides one
  python3-venv     # Debian's python3 cannot `-m venv` without it (no ensurepip)
  isc-dhcp-client  # dhclient: a real DHCP client against our server (tests/integration)
  busybox-static   # udhcpc (and the ramdisk's busybox); conflicts with package busybox
  nvme-cli         # nvme: the ramdisk's NVMe sanitize/format (the agent's sanitise job)
  hdparm           # the ramdisk's ATA secure erase
  sg3-utils        # sg_sanitize: the ramdisk's SCSI/SAS sanitize
  mdadm            # the ramdisk's software RAID (the agent's storage job)
  man-db           # man -l: the wheel's provisioner(1) renders (tests/e2e/test_wheel_install.py)
  kea-admin        # perfdhcp (DHCP load generator / relay)
  kea-dhcp4-server # bench/dhcp_bench.py peer
  dnsmasq-base     # the site's DHCP server beside our proxy mode; bench peer
  tftp-hpa         # tftp client
  atftp            # atftp client (blksize/tsize/windowsize)
  tftpd-hpa        # bench/tftp_bench.py peer (its service is never started)
  ipxe             # /usr/lib/ipxe: undionly.kpxe, snponly.efi, ipxe.efi (boot.assets_dir default)
  munge            # Slurm's auth daemon (tests start their own munged, PEERS.md §7)
  slurm-wlm        # Slurm 22.05; slurmctld accepts our topology.conf (tests/integration)
  slurmctld
  slurmd
  slurm-client     # scontrol
  slurmrestd       # Slurm REST API (tests/integration/test_slurm.py, PEERS.md §7)
  slurm-wlm-jwt-plugin # auth/jwt for slurmctld and slurmrestd
  ibsim-utils      # ibsim + umad2sim: a simulated InfiniBand fabric (PEERS.md §8)
  infiniband-diags # ibnetdiscover, iblinkinfo, sminfo
  rdma-core
  opensm           # subnet manager on the simulated fabric
  openssh-server   # sshd of the Ansible target (tests/peers/sshd.py, PEERS.md §9)
  openssh-client   # ssh, ssh-keygen: Ansible's connection
  debootstrap      # the Debian root the playbooks run against (cached, tests/peers/debootstrap.py)
  debconf          # debconf-set-selections --checkonly: rendered preseeds (always on Debian)
  debian-installer-12-netboot-amd64 # d-i kernel + initrd: the installer fetches our preseed (qemu)
  socat            # ssh ProxyCommand into the target's network namespace
  openipmi         # ipmi_sim: a real IPMI BMC on loopback (tests/peers/ipmi_sim.py, PEERS.md §4)
  ipmitool         # ipmi_sim's readiness probe
  qemu-system-x86  # the e2e VMs (tests/e2e/*qemu*)
  ovmf             # x86 UEFI firmware: OVMF's own PXE and HTTP boot (tests/e2e/test_pxe_qemu.py)
  ndisc6           # rdisc6: solicits our router advertisements (test_router_advertisement.py)
  qemu-system-arm  # qemu-system-aarch64: the Grace (arm64) e2e VMs
  qemu-efi-aarch64 # AAVMF: arm64 UEFI firmware with PXE and HTTP boot
  debian-installer-12-netboot-arm64 # signed grubaa64.efi + arm64 d-i: the Grace netboot chain
  grub-common      # grub-mkimage (arm64 netboot image with an embedded grub.cfg for HTTP boot)
  binutils         # readelf: the shared libraries of the arm64 ramdisk's python3 (no ldd for arm64)
  qemu-utils       # qemu-img: qcow2 images the agent's converter is checked against
  linux-image-amd64 # the kernel of the inspection ramdisk and of the e2e test's disk image
  cpio             # pxe/ramdisk/build.sh and the e2e disk image's initramfs
  kmod             # modprobe --show-depends (ramdisk modules)
  fdisk            # sfdisk: MBR/GPT images and --dump checks of the grown partition table
  gdisk            # sgdisk -v: the GPT the agent rewrote
  genisoimage      # isoinfo: reads the cloud-init seed back
  syslinux         # the e2e test's bootable disk image (MBR code, ldlinux)
  syslinux-common
  extlinux
  mtools           # files into that image's FAT partition without a loop mount
  dosfstools       # mkfs.vfat
  chromium         # headless browser of the console tests (tests/integration/test_console_browser.py)
  chromium-driver  # chromedriver: Selenium drives the system chromium (nothing downloaded)
  nginx            # benches only: the HTTP peer of bench/http_bench.py and bench/storm_bench.py
  wrk              # benches only: bench/http_bench.py load generator (iPXE scripts)
)
MIN_PYTHON=(3 11)

exec 3>&1 1>&2    # fd 3 = the real stdout, reserved for the final line
log() { printf 'setup.sh: %s\n' "$*"; }
die() { log "error: $*"; exit 1; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

# Run a command with its output kept back unless it fails (quiet on success).
quietly() {
  local out rc=0
  out=$(mktemp)
  "$@" >"$out" 2>&1 </dev/null || rc=$?
  ((rc == 0)) || cat "$out"
  rm -f "$out"
  return "$rc"
}

# dpkg-query prints the one field: `dpkg -s | grep -q` died of SIGPIPE under pipefail (exit
# 141) for packages whose record outlasts grep's first match, so they looked missing.
is_installed() {
  [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == 'install ok installed' ]]
}

# Foreign architectures whose packages the tests download (the arm64 inspection ramdisk and
# GRUB image are made from arm64 .debs: `apt-get download pkg:arm64`, never installed).
FOREIGN_ARCHES=(arm64)

install_debian_packages() {
  local wanted=("${APT_PACKAGES[@]}") arches=("${FOREIGN_ARCHES[@]}")
  if ((RUNTIME)); then wanted=("${RUNTIME_PACKAGES[@]}") arches=(); fi
  if ((DRY_RUN)); then
    log "packages: ${wanted[*]}"
    log "foreign architectures: ${arches[*]:-none}"
    return 0
  fi
  command -v dpkg >/dev/null || die "dpkg not found: this script targets Debian 12"
  local missing=() pkg arch update=0
  for arch in "${arches[@]}"; do
    if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
      log "dpkg --add-architecture $arch"
      ((EUID == 0)) || die "adding dpkg architecture $arch needs root"
      dpkg --add-architecture "$arch"
      update=1
    fi
  done
  for pkg in "${wanted[@]}"; do
    is_installed "$pkg" || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0 && update == 0)); then return 0; fi
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null && sudo -n true 2>/dev/null \
      || die "missing Debian packages (${missing[*]}); run as root or with passwordless sudo"
    sudo=(sudo -n)
  fi
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -o Dpkg::Use-Pty=0)
  quietly "${apt[@]}" update
  ((${#missing[@]})) || return 0
  log "apt-get install ${missing[*]}"
  quietly "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
}

# Resolve `python3` on PATH once (a pyenv shim resolves to its real interpreter).
find_python() {
  command -v python3 >/dev/null || die "python3 not found on PATH"
  PY=$(python3 -c 'import sys; print(sys.executable)')
  "$PY" -c "import sys; sys.exit(sys.version_info < (${MIN_PYTHON[0]}, ${MIN_PYTHON[1]}))" \
    || die "$PY is $("$PY" -V 2>&1); provisioner needs Python >= ${MIN_PYTHON[0]}.${MIN_PYTHON[1]}"
}

# Key: pyproject.toml + the interpreter + this checkout's path (an editable install points
# at one checkout, so two clones must not share a venv).
venv_path() {
  local key
  key=$(
    "$PY" - "$ROOT" <<'EOF'
import hashlib, pathlib, sys
root = pathlib.Path(sys.argv[1])
h = hashlib.sha256((root / "pyproject.toml").read_bytes())
h.update(f"\0{sys.version}\0{sys.base_prefix}\0{root}".encode())
print(h.hexdigest()[:12])
EOF
  )
  local home=${HOME:-$(getent passwd "$EUID" | cut -d: -f6)}    # CI may leave HOME unset
  local kind=venv
  ((RUNTIME)) && kind=venv-runtime    # no test extras: never the test suite's venv
  printf '%s/provisioner/%s-%s\n' "${XDG_CACHE_HOME:-$home/.cache}" "$kind" "$key"
}

create_venv() {
  local venv=$1 marker=$1/.provisioner-installed target=".[test]"
  ((RUNTIME)) && target="."
  if [[ -f $marker ]] && "$venv/bin/python" -c '' 2>/dev/null; then
    return 0
  fi
  if ((DRY_RUN)); then log "would create $venv (pip install -e $target)"; return 0; fi
  log "creating $venv (pip install -e $target)"
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  quietly env PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$venv/bin/python" -m pip install -q -e "$target"
  touch "$marker"
}

install_debian_packages
find_python
VENV=$(venv_path)
if ((DRY_RUN)); then
  create_venv "$VENV"
  ((RUNTIME)) || log "would build the Kubernetes peers (tests/peers/kube_build.sh) if go is found"
  printf '%s\n' "$VENV" >&3
  exit 0
fi
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9    # two concurrent runs must not build the same venv
create_venv "$VENV"
if ((RUNTIME)); then
  printf '%s\n' "$VENV" >&3
  exit 0
fi
# Kubernetes test peers (kube-apiserver, etcd, kwok; PEERS.md §10): built from Go modules once,
# cached by their pinned versions. No Go: the Kubernetes tests skip. Output goes to stderr.
if command -v go >/dev/null; then
  bash "$ROOT/tests/peers/kube_build.sh" >&2 || die "tests/peers/kube_build.sh failed"
else
  log "go not found: Kubernetes peers not built, their tests will skip"
fi
printf '%s\n' "$VENV" >&3
