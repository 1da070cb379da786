#!/usr/bin/env bash
# Builds the cocoon guest into OUTDIR: vmlinuz, initramfs.cpio.gz and BUILDINFO.
#
#   guest/build.sh OUTDIR
#
# The kernel is the package linux-image-cloud-amd64 depends on, downloaded
# (never installed on the host) into a cache; its virtio/vsock modules,
# busybox-static, the static cocoon-agent, its container init cocoon-cinit,
# a pod's pause cocoon-pause and the static runc the agent runs containers with go into the initramfs. The same
# inputs give a byte-identical initramfs: fixed mtimes, a sorted file list,
# `cpio --reproducible`, `gzip -n`.
#
# Environment:
#   COCOON_GUEST_CACHE  package cache directory (default build/cache)
#   COCOON_AGENT        agent binary (default bin/cocoon-agent, built if missing)
#   COCOON_CINIT        container init binary (default bin/cocoon-cinit, built if missing)
#   COCOON_PAUSE        a pod's pause binary (default bin/cocoon-pause, built if missing)
#   COCOON_RUNC         static runc with seccomp (default bin/guest/runc: make runc-guest)
#   SOURCE_DATE_EPOCH   mtime of every file in the initramfs (default 0)
set -euo pipefail

die() { echo "guest/build.sh: $*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: guest/build.sh OUTDIR"
repo=$(cd "$(dirname "$0")/.." && pwd)
guest="$repo/guest"
mkdir -p "$1"
out=$(cd "$1" && pwd)
cache=${COCOON_GUEST_CACHE:-$repo/build/cache}
agent=${COCOON_AGENT:-$repo/bin/cocoon-agent}
cinit=${COCOON_CINIT:-$repo/bin/cocoon-cinit}
pause=${COCOON_PAUSE:-$repo/bin/cocoon-pause}
runc=${COCOON_RUNC:-$repo/bin/guest/runc}
epoch=${SOURCE_DATE_EPOCH:-0}
export LC_ALL=C TZ=UTC

# kernel_package prints the exact kernel package the cloud meta-package wants.
kernel_package() {
	local pkg
	pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null |
		awk '/Depends: linux-image-[0-9]/{print $2; exit}') || true
	if [ -z "$pkg" ]; then
		apt-get update -qq >&2
		pkg=$(apt-cache depends linux-image-cloud-amd64 |
			awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	fi
	[ -n "$pkg" ] || die "cannot resolve the kernel package of linux-image-cloud-amd64"
	echo "$pkg"
}

# fetch PKG prints the path of PKG's candidate .deb in the cache, downloading
# it only when that exact version is not there yet.
fetch() {
	local pkg=$1 version sha deb
	version=$(apt-cache show --no-all-versions "$pkg" | awk '/^Version:/{print $2; exit}')
	sha=$(apt-cache show --no-all-versions "$pkg" | awk '/^SHA256:/{print $2; exit}')
	[ -n "$version" ] || die "package $pkg has no candidate version"
	deb="$cache/${pkg}_${version//:/%3a}_amd64.deb"
	if [ ! -f "$deb" ] || ! echo "$sha  $deb" | sha256sum -c --status; then
		download "$pkg=$version" || die "apt-get download $pkg=$version failed"
	fi
	echo "$sha  $deb" | sha256sum -c --status || die "$deb does not match its sha256 $sha"
	echo "$deb"
}

# download PKG=VERSION fetches a .deb into the cache, refreshing the package
# lists once if the mirror no longer has it.
download() {
	(cd "$cache" && apt-get download -q "$1" >/dev/null 2>&1) && return 0
	apt-get update -qq >&2 && (cd "$cache" && apt-get download -q "$1" >/dev/null 2>&1)
}

# module_file DIR NAME prints the uncompressed path of module NAME, unpacking
# .ko.xz/.ko.zst in place.
module_file() {
	local f
	f=$(find "$1" -name "$2.ko" -o -name "$2.ko.xz" -o -name "$2.ko.zst" | head -n1)
	[ -n "$f" ] || die "kernel module $2 not found"
	case "$f" in
	*.xz) xz -dc "$f" >"${f%.xz}" && f=${f%.xz} ;;
	*.zst) zstd -qdc "$f" >"${f%.zst}" && f=${f%.zst} ;;
	esac
	echo "$f"
}

# install_modules KROOT RELEASE ROOT copies guest/modules into ROOT/lib/modules,
# refusing an order in which a module precedes one it depends on.
install_modules() {
	local moddir="$1/lib/modules/$2" root=$3 mod f dep loaded=" "
	mkdir -p "$root/lib/modules"
	while read -r mod _; do
		case "$mod" in '#'* | '') continue ;; esac
		f=$(module_file "$moddir" "$mod")
		for dep in $(tr '\0' '\n' <"$f" | sed -n 's/^depends=//p' | tr ',' ' '); do
			case "$loaded" in *" $dep "*) ;; *) die "module $mod needs $dep listed before it in guest/modules" ;; esac
		done
		install -m 0644 "$f" "$root/lib/modules/$mod.ko"
		loaded="$loaded$mod "
	done <"$guest/modules"
	install -m 0644 "$guest/modules" "$root/etc/modules"
}

# install_busybox DEB ROOT installs busybox and a symlink for every applet
# (/init is guest/rootfs/init, which starts busybox init).
install_busybox() {
	local x=$work/busybox applet
	dpkg-deb -x "$1" "$x"
	install -m 0755 "$x/bin/busybox" "$2/bin/busybox"
	for applet in $("$x/bin/busybox" --list-full | sort); do
		[ -e "$2/$applet" ] || ln -s /bin/busybox "$2/$applet"
	done
}

# install_rootfs ROOT lays out the directories and guest/rootfs templates.
install_rootfs() {
	local root=$1 f
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,var}
	(cd "$guest/rootfs" && find . -type f) | sort | while read -r f; do
		install -D -m 0644 "$guest/rootfs/$f" "$root/$f"
	done
	chmod 0755 "$root/init" "$root/etc/init.d/rcS"
	chmod 0700 "$root/root"
	chmod 1777 "$root/tmp"
}

# pack ROOT OUT writes ROOT as a reproducible gzip'd newc cpio archive.
pack() {
	find "$1" -exec touch -h -d "@$epoch" {} +
	(cd "$1" && find . -print0 | sort -z |
		cpio --quiet --null --reproducible -H newc -o --owner=0:0) | gzip -9 -n >"$2"
}

for cmd in agent cinit pause; do
	bin=${!cmd}
	if [ ! -x "$bin" ]; then
		(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$bin" "./cmd/cocoon-$cmd")
	fi
	if command -v file >/dev/null && ! file -b "$bin" | grep -q 'statically linked'; then
		die "$bin is not statically linked (build it with CGO_ENABLED=0)"
	fi
done
[ -x "$runc" ] || die "$runc is missing (make runc-guest builds it)"
if command -v file >/dev/null && ! file -b "$runc" | grep -q 'statically linked'; then
	die "$runc is not statically linked (make runc-guest builds it so)"
fi
# The guest has no seccomp without it: runc would start containers unconfined.
"$runc" --version | grep -q '^libseccomp: ' || die "$runc is built without seccomp (make runc-guest)"

mkdir -p "$cache"
work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
umask 022

kpkg=$(kernel_package)
kdeb=$(fetch "$kpkg")
bdeb=$(fetch busybox-static)
dpkg-deb -x "$kdeb" "$work/kernel"
release=$(basename "$(ls -d "$work"/kernel/lib/modules/*)")

root=$work/root
install_rootfs "$root"
install_busybox "$bdeb" "$root"
install_modules "$work/kernel" "$release" "$root"
install -m 0755 "$agent" "$root/sbin/cocoon-agent"
install -m 0755 "$cinit" "$root/sbin/cocoon-cinit"
install -m 0755 "$pause" "$root/sbin/cocoon-pause"
install -m 0755 "$runc" "$root/usr/bin/runc"
pack "$root" "$work/initramfs.cpio.gz"
install -m 0644 "$work/kernel/boot/vmlinuz-$release" "$work/vmlinuz"

{
	echo "kernel.package=$kpkg"
	echo "kernel.version=$(dpkg-deb -f "$kdeb" Version)"
	echo "kernel.deb.sha256=$(sha256sum "$kdeb" | cut -d' ' -f1)"
	echo "kernel.release=$release"
	echo "busybox.package=busybox-static"
	echo "busybox.version=$(dpkg-deb -f "$bdeb" Version)"
	echo "busybox.deb.sha256=$(sha256sum "$bdeb" | cut -d' ' -f1)"
	echo "agent.sha256=$(sha256sum "$agent" | cut -d' ' -f1)"
	echo "cinit.sha256=$(sha256sum "$cinit" | cut -d' ' -f1)"
	echo "pause.sha256=$(sha256sum "$pause" | cut -d' ' -f1)"
	echo "runc.version=$("$runc" --version | sed -n 's/^runc version //p')"
	echo "runc.libseccomp=$("$runc" --version | sed -n 's/^libseccomp: //p')"
	echo "runc.sha256=$(sha256sum "$runc" | cut -d' ' -f1)"
	echo "modules=$(grep -v '^#' "$guest/modules" | tr ' ' ':' | paste -sd, -)"
	echo "source_date_epoch=$epoch"
	echo "vmlinuz.sha256=$(sha256sum "$work/vmlinuz" | cut -d' ' -f1)"
	echo "initramfs.sha256=$(sha256sum "$work/initramfs.cpio.gz" | cut -d' ' -f1)"
} >"$work/BUILDINFO"

for f in vmlinuz initramfs.cpio.gz BUILDINFO; do
	mv -f "$work/$f" "$out/$f"
done
echo "guest/build.sh: $(grep '^initramfs.sha256=' "$out/BUILDINFO") in $out"
