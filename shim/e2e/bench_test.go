package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/containerd-shim-cocoon/internal/ctrdtest"
)

// BenchmarkRunEcho is `ctr run --rm ... echo hi` end to end: restore the
// VM from the snapshot image, run the process, print, exit, delete.
func BenchmarkRunEcho(b *testing.B) {
	c := stack(b, "")
	b.ResetTimer()
	for i := range b.N {
		out, err := run(c, []string{"--rm"}, fmt.Sprintf("b%d", i), "echo", "hi")
		if err != nil || strings.TrimSpace(out) != "hi" {
			b.Fatalf("ctr run: %q, %v", out, err)
		}
	}
}

// restrictedFlags confine a container as Kubernetes' restricted profile
// does, as far as ctr says it: containerd's default seccomp filter, none
// of the capabilities ctr gives (it takes no "ALL"), a read-only root, a
// user that is not root.
var restrictedFlags = func() []string {
	flags := []string{"--seccomp", "--read-only", "--user", "1000:1000"}
	for _, c := range []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
		"SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"} {
		flags = append(flags, "--cap-drop", "CAP_"+c)
	}
	return flags
}()

// BenchmarkConfinement times `ctr run -d` (a VM of its own restored and
// its process started) of a container with ctr's defaults and of a
// restricted one, in turns, for the snapshot image and for an ordinary
// image on the base snapshot, and the guest's share of each from the
// restore report: what the confinement costs a start, before and after in
// one run, as medians.
//
//	go test -run '^$' -bench BenchmarkConfinement -benchtime 10x ./shim/e2e/
func BenchmarkConfinement(b *testing.B) {
	c, _ := ordinaryStack(b, imageRef)
	for _, kind := range []struct {
		name string
		run  func(*ctrdtest.Containerd, []string, string, ...string) (string, error)
	}{{"snapshot-image", run}, {"ordinary-image", runOrdinary}} {
		b.Run(kind.name, func(b *testing.B) {
			took := map[bool][]time.Duration{}
			phases := map[bool]map[string][]time.Duration{false: {}, true: {}}
			for i := range b.N {
				for _, restricted := range []bool{i%2 == 0, i%2 != 0} {
					flags := []string{"-d"}
					if restricted {
						flags = append(flags, restrictedFlags...)
					}
					id := fmt.Sprintf("conf-%s-%d-%t", kind.name, i, restricted)
					began := time.Now()
					if _, err := kind.run(c, flags, id, "sleep", "600"); err != nil {
						b.Fatal(err)
					}
					took[restricted] = append(took[restricted], time.Since(began))
					for _, p := range readReport(b, c, id).Phases {
						phases[restricted][p.Name] = append(phases[restricted][p.Name], time.Duration(p.Duration))
					}
					removeTask(b, c, id)
				}
			}
			reportConfinement(b, took, phases)
		})
	}
}

// reportConfinement reports the medians of a start and of the guest's
// phases, default and restricted, and the starts' ratio.
func reportConfinement(b *testing.B, took map[bool][]time.Duration, phases map[bool]map[string][]time.Duration) {
	def, res := median(took[false]), median(took[true])
	b.ReportMetric(ms(def), "default-ms")
	b.ReportMetric(ms(res), "restricted-ms")
	b.ReportMetric(float64(res)/float64(def), "restricted/default")
	for _, name := range []string{"init", "guest rootfs", "guest confine", "guest process"} {
		unit := strings.ReplaceAll(name, " ", "-")
		b.ReportMetric(ms(median(phases[false][name])), "default-"+unit+"-ms")
		b.ReportMetric(ms(median(phases[true][name])), "restricted-"+unit+"-ms")
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
