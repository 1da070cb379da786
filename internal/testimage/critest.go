package testimage

import (
	"context"
	"fmt"
	"io/fs"
	"os"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// The registries critest v1.37.0's images come from; a registry mirror
// serving CritestImages must answer for each.
var CritestRegistries = []string{"registry.k8s.io", "k8s.gcr.io", "gcr.io", "docker.io"}

// Where critest's own images live (its pkg/validate consts).
const (
	critestE2E   = "registry.k8s.io/e2e-test-images/"
	critestTools = "gcr.io/k8s-staging-cri-tools/"
)

// CritestImages are the images critest v1.37.0's validation specs pull,
// named as critest names them and built from busybox, pause and two small
// programs (no registry is reachable): its default container image,
// web servers (nginx and httpd stand-ins), the nonewprivs image, images
// with users and groups in their config, tagged images (some tags of one
// image, some of different ones), and pause as registry.k8s.io and
// k8s.gcr.io name it (an image of its own, so removing it by ID leaves
// the sandbox image). dir holds the programs' builds. The digest-pinned
// test-image-digest cannot be rebuilt and is absent.
func CritestImages(ctx context.Context, dir, busybox string, pause Image) ([]Image, error) {
	bb, err := Busybox(BusyboxOptions{Name: critestE2E + "busybox:1.29-2", Layers: 1, Binary: busybox, HardLinks: true})
	if err != nil {
		return nil, fmt.Errorf("critest images: %w", err)
	}
	base := []Layer{bb.Layers[0], critestUtils()}
	web, err := programFile(ctx, dir, "webserver")
	if err != nil {
		return nil, err
	}
	nnp, err := programFile(ctx, dir, "nnp")
	if err != nil {
		return nil, err
	}
	imgs := []Image{
		busyboxImage(bb.Name, base),
		webServer(critestE2E+"nginx:1.14-2", base, web, "/usr/sbin/nginx", 80),
		webServer(critestE2E+"httpd:2.4.39-4", base, web, "/usr/local/apache2/bin/httpd", 80),
		webServer(critestTools+"hostnet-nginx-amd64:latest", base, web, "/usr/sbin/nginx", 12003),
		{
			Name:   critestE2E + "nonewprivs:1.3",
			Config: ocispec.ImageConfig{Entrypoint: []string{"/usr/local/bin/nnp"}},
			Layers: []Layer{{File("usr/local/bin/nnp", 0o755|fs.ModeSetuid, nnp)}},
		},
	}
	imgs = append(imgs, userImages(base)...)
	for _, name := range []string{"test-image-latest", "test-image-1", "test-image-2", "test-image-3"} {
		imgs = append(imgs, marked(critestTools+name+":latest", base, name))
	}
	imgs = append(imgs, tagged(marked("", base, "test-image-tag"), "test-image-tag", "test", "all")...)
	imgs = append(imgs, tagged(marked("", base, "same-image"), "test-image-tags", "1", "2", "3")...)
	for _, name := range []string{"registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"} {
		p := pause
		p.Name = name
		p.Config.Labels = map[string]string{"io.cocoon.critest": "pause:3.9"}
		imgs = append(imgs, p)
	}
	return imgs, nil
}

// critestUtils is what critest's specs use that Debian's busybox lacks
// (pgrep, ipcs -m from /proc), and the accounts of a busybox image.
func critestUtils() Layer {
	return Layer{
		File("bin/pgrep", 0o755, []byte("#!/bin/sh\n# pgrep NAME: the pids whose command is NAME.\nfound=1\n"+
			"for d in /proc/[0-9]*; do read -r c < \"$d/comm\" 2>/dev/null || continue\n"+
			"[ \"$c\" = \"$1\" ] && echo \"${d#/proc/}\" && found=0; done\nexit $found\n")),
		File("bin/ipcs", 0o755, []byte("#!/bin/sh\n# ipcs -m: the System V shared memory segments.\ncat /proc/sysvipc/shm\n")),
		File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33:www-data:/var/www:/bin/false\n"+
			"nobody:x:65534:65534:nobody:/home:/bin/false\n")),
		File("etc/group", 0o644, []byte("root:x:0:\nwww-data:x:33:\nnogroup:x:65534:\n")),
		Dir("var/run", 0o755),
	}
}

func busyboxImage(name string, base []Layer) Image {
	return Image{Name: name, Config: ocispec.ImageConfig{Env: []string{DefaultPath}, Cmd: []string{"sh"}}, Layers: base}
}

// programFile builds a program of this package (webserver, nnp) and reads it.
func programFile(ctx context.Context, dir, name string) ([]byte, error) {
	bin, err := buildProgram(ctx, dir, name)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(bin)
}

// marked is base plus a file named file at the root, as critest's
// image-test Dockerfile adds one.
func marked(name string, base []Layer, file string) Image {
	img := busyboxImage(name, base)
	img.Layers = append(base[:len(base):len(base)], Layer{File(file, 0o644, []byte(file+"\n"))})
	return img
}

// tagged is img under critestTools+repo at each of tags: one image, so
// one digest.
func tagged(img Image, repo string, tags ...string) []Image {
	imgs := make([]Image, 0, len(tags))
	for _, tag := range tags {
		img.Name = critestTools + repo + ":" + tag
		imgs = append(imgs, img)
	}
	return imgs
}

// webServer is the webserver program at path serving port: as nginx it
// writes /var/run/nginx.pid and shows "master process" in its command
// line, as critest's pid namespace specs look for.
func webServer(name string, base []Layer, program []byte, path string, port int) Image {
	entry := []string{path, fmt.Sprintf("-port=%d", port)}
	if name != critestE2E+"httpd:2.4.39-4" {
		entry = append(entry, "-pid=/var/run/nginx.pid", "nginx: master process")
	}
	return Image{
		Name:   name,
		Config: ocispec.ImageConfig{Env: []string{DefaultPath}, Entrypoint: entry},
		Layers: append(base[:len(base):len(base)], Layer{File(path, 0o755, program)}),
	}
}

// userImages are critest's image-user and image-predefined-group images:
// a config User by uid, by name, with a group, and a user in a group the
// image's /etc/group defines (uid 1000, gid 50000).
func userImages(base []Layer) []Image {
	users := []struct{ repo, user string }{
		{"test-image-user-uid", "1002"},
		{"test-image-user-username", "www-data"},
		{"test-image-user-uid-group", "1003:1004"},
		{"test-image-user-username-group", "www-data:1004"},
	}
	imgs := make([]Image, 0, len(users)+1)
	for _, u := range users {
		img := busyboxImage(critestTools+u.repo+":latest", base)
		img.Config.User = u.user
		imgs = append(imgs, img)
	}
	group := busyboxImage(critestTools+"test-image-predefined-group:latest", base)
	group.Config.User = "1000"
	group.Layers = append(base[:len(base):len(base)], Layer{
		File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\ndefault-user:x:1000:1000:default-user:/home/default-user:/bin/sh\n")),
		File("etc/group", 0o644, []byte("root:x:0:\ndefault-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n")),
	})
	return append(imgs, group)
}
