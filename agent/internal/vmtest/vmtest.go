// Package vmtest boots the project's guest on QEMU for the agent's VM tests,
// independently of the QEMU driver.
package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/agent"
	"github.com/cocoonstack/containerd-shim-cocoon/internal/testenv"
)

// ReadyTimeout bounds a cold boot to a ready agent (TCG is slow).
const ReadyTimeout = 90 * time.Second

// VM is a guest booted from build/guest, killed when the test ends.
type VM struct {
	Socket string // host end of the agent's virtio-serial port
	Log    string // the guest's serial console
	QMP    string // QEMU's QMP socket
	cmd    *exec.Cmd
	exited chan struct{}
}

// Options change how Start runs the guest.
type Options struct {
	// MemoryFile backs guest RAM with a file, as snapshots need: mapped
	// shared when Share, else private (how a clone restores from it).
	MemoryFile string
	Share      bool
	// Incoming starts QEMU paused, waiting for Restore.
	Incoming bool
	// NICMAC, when set, gives the guest a virtio-net NIC with this MAC on
	// a hub with no other port: it carries no traffic anywhere.
	NICMAC string
	// Disk, when set, gives the guest this image as a read-only virtio-blk
	// disk whose serial is DiskSerial.
	Disk, DiskSerial string
}

// Boot starts QEMU with the guest's kernel and initramfs (microvm, the agent
// port named "agent") and returns at once; use Client to wait for the agent.
func Boot(t testing.TB) *VM {
	t.Helper()
	return Start(t, Options{})
}

// Start is Boot with options.
func Start(t testing.TB, o Options) *VM {
	t.Helper()
	qemu := testenv.QEMU(t)
	guest := testenv.Guest(t)
	// unix socket paths are short; t.TempDir's can be too long.
	dir, err := os.MkdirTemp("", "cocoon-vm-")
	if err != nil {
		t.Fatal(err)
	}
	vm := &VM{
		Socket: filepath.Join(dir, "agent.sock"),
		Log:    filepath.Join(dir, "serial.log"),
		QMP:    filepath.Join(dir, "qmp.sock"),
		exited: make(chan struct{}),
	}
	args := append(Args(guest, vm.Socket, vm.Log), "-qmp", "unix:"+vm.QMP+",server=on,wait=off")
	vm.cmd = exec.Command(qemu, append(args, o.args()...)...)
	var stderr bytes.Buffer
	vm.cmd.Stderr = &stderr
	if err := vm.start(); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("start qemu: %v", err)
	}
	t.Cleanup(func() {
		vm.Stop()
		if t.Failed() {
			t.Logf("qemu stderr: %s\nguest console (tail):\n%s", stderr.String(), vm.consoleTail())
		}
		os.RemoveAll(dir)
	})
	return vm
}

// start starts QEMU with a parent-death signal from a thread that stays
// until QEMU exits (the signal follows the forking thread): QEMU dies
// with the test binary, a test timeout's panic included, and not before.
func (vm *VM) start() error {
	vm.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := vm.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = vm.cmd.Wait()
		close(vm.exited)
	}()
	return <-started
}

// Args is the QEMU command line booting guestDir's kernel with the agent
// port on socket and the console in logFile.
func Args(guestDir, socket, logFile string) []string {
	return []string{
		"-accel", Accel(), "-M", "microvm", "-m", "256M", "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-serial", "file:" + logFile,
		"-kernel", filepath.Join(guestDir, "vmlinuz"),
		"-initrd", filepath.Join(guestDir, "initramfs.cpio.gz"),
		"-append", KernelCmdline(),
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,path=" + socket + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=agent",
	}
}

func (o Options) args() []string {
	var args []string
	if o.MemoryFile != "" {
		share := map[bool]string{true: "on", false: "off"}[o.Share]
		args = append(args,
			"-object", "memory-backend-file,id=microvm.ram,size=256M,mem-path="+o.MemoryFile+",share="+share,
			"-machine", "memory-backend=microvm.ram")
	}
	if o.Incoming {
		args = append(args, "-incoming", "defer")
	}
	if o.NICMAC != "" {
		args = append(args, "-netdev", "hubport,id=nic,hubid=0", "-device", "virtio-net-device,netdev=nic,mac="+o.NICMAC)
	}
	if o.Disk != "" {
		args = append(args,
			"-drive", "file="+o.Disk+",if=none,id=disk,format=raw,readonly=on",
			"-device", "virtio-blk-device,drive=disk,serial="+o.DiskSerial)
	}
	return args
}

// Accel is kvm on hosts whose KVM runs stock kernels (Intel/AMD), else tcg:
// PVM's /dev/kvm cannot boot the guest.
func Accel() string {
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			if _, err := os.Stat("/dev/kvm"); err == nil {
				return "kvm"
			}
		}
	}
	return "tcg"
}

// KernelCmdline is the guest's command line. Under TCG the guest's TSC runs
// at the host's rate, and the kernel's PIT calibration of it fails on a busy
// host (the boot then hangs), so the rate is passed in.
func KernelCmdline() string {
	cmdline := "console=ttyS0 quiet panic=-1"
	if khz := hostTSCkHz(); khz > 0 && Accel() == "tcg" {
		cmdline += " tsc_early_khz=" + strconv.Itoa(khz)
	}
	return cmdline
}

func hostTSCkHz() int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0
			}
			return int(mhz * 1000)
		}
	}
	return 0
}

// Dial opens a new agent session.
func (vm *VM) Dial(ctx context.Context) (net.Conn, error) {
	return agent.DialUnix(ctx, vm.Socket)
}

// Client waits for the agent and returns a client closed when t ends.
func (vm *VM) Client(t testing.TB) *agent.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	go func() {
		select {
		case <-vm.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := agent.WaitReady(ctx, vm.Dial)
	if err != nil {
		t.Fatalf("guest agent not ready: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills QEMU and waits for it to exit.
func (vm *VM) Stop() {
	_ = vm.cmd.Process.Kill()
	<-vm.exited
}

// Exited is closed when QEMU has exited.
func (vm *VM) Exited() <-chan struct{} { return vm.exited }

func (vm *VM) consoleTail() string {
	b, err := os.ReadFile(vm.Log)
	if err != nil {
		return fmt.Sprintf("(no console log: %v)", err)
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}
