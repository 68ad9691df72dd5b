package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sluiceBinary builds ./cmd/sluice once into the work directory, for the
// scenarios that need a worker in a process of its own.
func (e *env) sluiceBinary(ctx context.Context) (string, error) {
	e.binOnce.Do(func() {
		out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
		if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
			e.binErr = fmt.Errorf("bench: find the module root (run from the repository): %v", err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		e.bin = filepath.Join(e.workDir, "sluice")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", e.bin, "./cmd/sluice")
		cmd.Dir = root
		if msg, err := cmd.CombinedOutput(); err != nil {
			e.binErr = fmt.Errorf("bench: build ./cmd/sluice: %v\n%s", err, msg)
		}
	})
	return e.bin, e.binErr
}

// workerProcess is a `sluice worker` child process.
type workerProcess struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done is closed
}

// startWorkerProcess runs `sluice worker` with the run's Kafka and Redis,
// the given sink and pool flags.
func (e *env) startWorkerProcess(ctx context.Context, sinkURL string, p pool, poolName, workerID string, spec workerSpec) (*workerProcess, error) {
	bin, err := e.sluiceBinary(ctx)
	if err != nil {
		return nil, err
	}
	args := []string{"worker",
		"--brokers", strings.Join(e.brokers, ","), "--redis-addr", e.redisAddr, "--sink", sinkURL,
		"--pool", poolName, "--capacity", strconv.FormatFloat(p.capacity, 'f', -1, 64), "--unit", string(p.unit),
		"--partitions", strconv.Itoa(p.partitions), "--topic", spec.topic, "--group", spec.group,
		"--id-field", "id", "--worker-id", workerID, "--log-level", "error"}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sluice worker: %w", err)
	}
	w := &workerProcess{cmd: cmd, done: make(chan struct{})}
	go func() { w.err = cmd.Wait(); close(w.done) }()
	return w, nil
}

// stop sends SIGTERM and waits up to 20 s, then kills.
func (w *workerProcess) stop() {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(20 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
	}
}

// kill sends SIGKILL and waits.
func (w *workerProcess) kill() {
	_ = w.cmd.Process.Kill()
	<-w.done
}

// peakRSS returns the process's peak resident set size (VmHWM) in bytes.
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			fields := strings.Fields(rest)
			if len(fields) >= 1 {
				kb, err := strconv.ParseInt(fields[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
