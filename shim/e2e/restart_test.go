package e2e

import "testing"

// TestContainerdRestart restarts containerd while a task runs: the new
// containerd must reconnect to the shim, list the task, and kill and
// delete it.
func TestContainerdRestart(t *testing.T) {
	c := stack(t, "")
	if _, err := run(c, []string{"-d"}, "t1", "sleep", "600"); err != nil {
		t.Fatal(err)
	}
	vmPID, _ := taskPID(t, c, "t1")
	c.Restart()
	if pid, st := taskPID(t, c, "t1"); pid != vmPID || st != "RUNNING" {
		t.Fatalf("after the restart task t1 is %s with pid %d, want RUNNING with %d", st, pid, vmPID)
	}
	if _, err := c.Ctr("task", "kill", "--signal", "SIGKILL", "t1"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "t1", "STOPPED")
	if _, err := c.Ctr("task", "delete", "t1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ctr("container", "rm", "t1"); err != nil {
		t.Fatal(err)
	}
	if processRuns(vmPID) {
		t.Fatalf("hypervisor %d still runs after delete", vmPID)
	}
}
