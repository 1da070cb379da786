// Package guest holds the reproducible guest build: build.sh makes
// vmlinuz, initramfs.cpio.gz and BUILDINFO from Debian's cloud kernel, its
// virtio and vsock modules (listed in modules), busybox-static, the
// templates under rootfs/, the static cocoon-agent and a static runc.
package guest
