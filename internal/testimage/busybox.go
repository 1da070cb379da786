package testimage

import (
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// The busybox image's users and files.
const (
	// DefaultBusybox is Debian busybox-static's binary.
	DefaultBusybox = "/bin/busybox"
	// User is the image's non-root user (uid UID, primary group UID, also
	// in the supplementary group ExtraGroup with gid ExtraGID).
	User       = "app"
	UID        = 1000
	ExtraGroup = "extra"
	ExtraGID   = 1001
	// RandomFile holds RandomContent, fresh for every image built.
	RandomFile = "/data/random.txt"
	// WhitedOutFile is in the lowest layer and removed by a whiteout in
	// the top one when the image has 2 or more layers.
	WhitedOutFile = "/etc/whited-out"
	// DefaultPath is the image's PATH when its config sets none.
	DefaultPath = "PATH=/bin"
)

// BusyboxOptions shape Busybox's image.
type BusyboxOptions struct {
	// Name is the image reference.
	Name string
	// Config is the image config: entrypoint, cmd, user, env, working dir.
	// Env gets DefaultPath unless it sets PATH.
	Config ocispec.ImageConfig
	// Layers is how many layers the image has (at least 1). With 2 or
	// more, the lowest holds busybox, /etc and WhitedOutFile, each middle
	// one a file /layers/N, and the top one RandomFile and a whiteout of
	// WhitedOutFile.
	Layers int
	// Binary is the static busybox to copy in; DefaultBusybox when empty.
	Binary string
	// HardLinks links the applets to busybox by hard link, as the
	// busybox images of registries do, instead of by symlink (masking a
	// symlinked applet masks busybox itself).
	HardLinks bool
}

// BusyboxImage is the image and what a test checks inside it.
type BusyboxImage struct {
	Image
	// RandomContent is RandomFile's content.
	RandomContent string
	// WhitedOut is WhitedOutFile when a whiteout removed it, else "".
	WhitedOut string
}

// Busybox is a busybox image: static busybox at /bin/busybox with a
// symlink per applet, /etc/passwd and /etc/group with root and User, a
// text file with random content, and mount points (/proc, /sys, /dev,
// /tmp, /run).
func Busybox(opts BusyboxOptions) (*BusyboxImage, error) {
	if opts.Layers < 1 {
		return nil, fmt.Errorf("busybox image: %d layers: want at least 1", opts.Layers)
	}
	bin := opts.Binary
	if bin == "" {
		bin = DefaultBusybox
	}
	base, err := busyboxBase(bin, opts.HardLinks)
	if err != nil {
		return nil, err
	}
	img := &BusyboxImage{Image: Image{Name: opts.Name, Config: opts.Config}, RandomContent: randomText()}
	if !hasPath(img.Config.Env) {
		img.Config.Env = append([]string{DefaultPath}, img.Config.Env...)
	}
	random := File(RandomFile, 0o644, []byte(img.RandomContent))
	if opts.Layers == 1 {
		img.Layers = []Layer{append(base, random)}
		return img, nil
	}
	img.Layers = append(img.Layers, append(base, File(WhitedOutFile, 0o644, []byte("removed by the top layer\n"))))
	for i := 1; i < opts.Layers-1; i++ {
		img.Layers = append(img.Layers, Layer{File(fmt.Sprintf("layers/%d", i), 0o644, fmt.Appendf(nil, "layer %d\n", i))})
	}
	img.Layers = append(img.Layers, Layer{random, Whiteout(WhitedOutFile)})
	img.WhitedOut = WhitedOutFile
	return img, nil
}

// busyboxBase is the lowest layer: busybox, its applets, users, mount points.
func busyboxBase(bin string, hardLinks bool) (Layer, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("busybox image: %w (install busybox-static)", err)
	}
	if err := checkStatic(bin); err != nil {
		return nil, err
	}
	applets, err := exec.Command(bin, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox image: list %s applets: %w", bin, err)
	}
	l := Layer{
		File("bin/busybox", 0o755, data),
		File("etc/passwd", 0o644, fmt.Appendf(nil, "root:x:0:0:root:/root:/bin/sh\n%s:x:%d:%d:%s:/home/%s:/bin/sh\n", User, UID, UID, User, User)),
		File("etc/group", 0o644, fmt.Appendf(nil, "root:x:0:\n%s:x:%d:\n%s:x:%d:%s\n", User, UID, ExtraGroup, ExtraGID, User)),
		Dir("home/"+User, 0o755).Owned(UID, UID),
		Dir("root", 0o700),
		Dir("tmp", 0o777|fs.ModeSticky),
		Dir("proc", 0o555), Dir("sys", 0o555), Dir("dev", 0o755), Dir("run", 0o755),
	}
	for _, a := range strings.Fields(string(applets)) {
		switch {
		case a == "busybox":
		case hardLinks:
			l = append(l, Hardlink("bin/"+a, "bin/busybox"))
		default:
			l = append(l, Symlink("bin/"+a, "busybox"))
		}
	}
	return l, nil
}

// checkStatic refuses a dynamically linked binary: the image has no libc.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("busybox image: %s: %w: want a static ELF binary", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("busybox image: " + bin + " is dynamically linked: want a static busybox (Debian busybox-static)")
		}
	}
	return nil
}

func hasPath(env []string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			return true
		}
	}
	return false
}

// randomText is a line of 32 random bytes in hex.
func randomText() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b) + "\n"
}
