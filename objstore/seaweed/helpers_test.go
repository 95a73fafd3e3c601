package seaweed_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kloud-dev/kloud/objstore/s3client"
)

// eventually polls f every 100 ms until it returns nil, for 20 s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

func put(ctx context.Context, c *s3.Client, bucket, key, body string) error {
	return s3client.Put(ctx, c, bucket, key, body)
}

func get(ctx context.Context, c *s3.Client, bucket, key string) error {
	_, err := s3client.Get(ctx, c, bucket, key)
	return err
}

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// lockedBuffer is a buffer weed's output goes to while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
