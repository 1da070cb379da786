package testimage

import (
	"fmt"

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

// The web servers critest's specs reach: the nginx and httpd images on
// port 80, the host-network nginx on 12003.
const (
	webPort        = 80
	hostNetWebPort = 12003
)

// CritestImages are the images critest v1.37.0's validation specs pull,
// named as critest names them and built from busybox (no registry is
// reachable): its default container image, web servers (busybox httpd in
// place of nginx and httpd, logging "httpd" as the multi-container spec
// expects), the images with users and groups in their config, tagged
// images (some tags of one image, some of different ones), and pause
// (as registry.k8s.io and k8s.gcr.io name it) from the pause image.
// The digest-pinned test-image-digest cannot be rebuilt and is absent.
func CritestImages(busybox string, pause Image) ([]Image, error) {
	bb, err := Busybox(BusyboxOptions{Name: critestE2E + "busybox:1.29-2", Layers: 1, Binary: busybox})
	if err != nil {
		return nil, fmt.Errorf("critest images: %w", err)
	}
	base := bb.Layers[0]
	imgs := []Image{{Name: bb.Name, Config: bb.Config, Layers: bb.Layers}}
	imgs = append(imgs,
		webServer(critestE2E+"nginx:1.14-2", base, webPort),
		webServer(critestE2E+"httpd:2.4.39-4", base, webPort),
		webServer(critestTools+"hostnet-nginx-amd64:latest", base, hostNetWebPort),
	)
	imgs = append(imgs, userImages(base)...)
	for _, name := range []string{"test-image-latest", "test-image-1", "test-image-2", "test-image-3"} {
		imgs = append(imgs, marked(critestTools+name+":latest", base, name))
	}
	imgs = append(imgs, tagged(marked("", base, "test-image-tag"), "test-image-tag", "test", "all")...)
	imgs = append(imgs, tagged(marked("", base, "same-image"), "test-image-tags", "1", "2", "3")...)
	for _, name := range []string{"registry.k8s.io/pause:3.9", "k8s.gcr.io/pause:3.9"} {
		p := pause
		p.Name = name
		imgs = append(imgs, p)
	}
	return imgs, nil
}

// marked is base plus a file named file at the root, as critest's
// image-test Dockerfile adds one.
func marked(name string, base Layer, file string) Image {
	return Image{
		Name:   name,
		Config: ocispec.ImageConfig{Env: []string{DefaultPath}, Cmd: []string{"sh"}},
		Layers: []Layer{base, {File(file, 0o644, []byte(file+"\n"))}},
	}
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

// webServer serves a page on port from busybox httpd in the foreground,
// after a line naming it on stdout.
func webServer(name string, base Layer, port int) Image {
	script := fmt.Sprintf("echo 'httpd: serving /www on port %d'; exec httpd -f -p %d -h /www", port, port)
	return Image{
		Name:   name,
		Config: ocispec.ImageConfig{Env: []string{DefaultPath}, Entrypoint: []string{"/bin/sh", "-c", script}},
		Layers: []Layer{base, {File("www/index.html", 0o644, []byte("<html><body>cocoon critest</body></html>\n"))}},
	}
}

// userImages are critest's image-user and image-predefined-group images:
// a config User by uid, by name, with a group, and a user in a group the
// image's /etc/group defines (uid 1000, gid 50000).
func userImages(base Layer) []Image {
	accounts := Layer{
		File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"+
			"www-data:x:33:33:www-data:/var/www:/bin/sh\n"+
			"default-user:x:1000:1000:default-user:/home/default-user:/bin/sh\n")),
		File("etc/group", 0o644, []byte("root:x:0:\nwww-data:x:33:\ndefault-user:x:1000:\n"+
			"group-defined-in-image:x:50000:default-user\n")),
	}
	users := []struct{ repo, user string }{
		{"test-image-user-uid", "1002"},
		{"test-image-user-username", "www-data"},
		{"test-image-user-uid-group", "1003:1004"},
		{"test-image-user-username-group", "www-data:1004"},
		{"test-image-predefined-group", "1000"},
	}
	imgs := make([]Image, 0, len(users))
	for _, u := range users {
		imgs = append(imgs, Image{
			Name:   critestTools + u.repo + ":latest",
			Config: ocispec.ImageConfig{Env: []string{DefaultPath}, Cmd: []string{"sh"}, User: u.user},
			Layers: []Layer{base, accounts},
		})
	}
	return imgs
}
