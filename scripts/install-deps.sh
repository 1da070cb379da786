#!/usr/bin/env bash
# Installs the Debian packages cocoon's guest build and tests need. Idempotent:
# does nothing when everything is present.
set -euo pipefail
pkgs=(qemu-system-x86 busybox-static cpio protobuf-compiler libprotobuf-dev e2fsprogs erofs-utils runc
	runsc # gVisor, the bench's peer
	gcc libc6-dev pkg-config libseccomp-dev) # the last four: the guest's static runc
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: need root to install: ${missing[*]}" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
