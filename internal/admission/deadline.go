package admission

import (
	"context"
	"sync"
	"time"
)

// WithDeadline is context.WithDeadline for a request's deadline, which
// almost nothing waits on: a read served from memory only asks Err and
// Deadline. It arms no timer and registers nothing with parent until
// something asks for Done (or derives a context from it); then it is
// context.WithDeadline's context. Before that, Err is computed: the
// parent's error, else DeadlineExceeded once the deadline has passed.
//
// context.WithTimeout took 4 % of a loaded single node's CPU under GET
// (its timer, and its registration with the request's context).
func WithDeadline(parent context.Context, d time.Time) (context.Context, context.CancelFunc) {
	c := &lazyDeadline{Context: parent, deadline: d}
	return c, c.cancel
}

type lazyDeadline struct {
	context.Context // the parent
	deadline        time.Time

	mu       sync.Mutex
	real     context.Context // context.WithDeadline's, once started
	stop     context.CancelFunc
	canceled bool
}

// started returns the real context, making it on the first call.
func (c *lazyDeadline) started() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.real == nil {
		c.real, c.stop = context.WithDeadline(c.Context, c.deadline)
		if c.canceled {
			c.stop()
		}
	}
	return c.real
}

func (c *lazyDeadline) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.canceled = true
	if c.stop != nil {
		c.stop()
	}
}

func (c *lazyDeadline) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *lazyDeadline) Done() <-chan struct{} { return c.started().Done() }

func (c *lazyDeadline) Err() error {
	c.mu.Lock()
	real, canceled := c.real, c.canceled
	c.mu.Unlock()
	switch {
	case real != nil:
		return real.Err()
	case canceled:
		return context.Canceled
	}
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !time.Now().Before(c.deadline) {
		// As the real context would say; Done, if asked now, is
		// closed already (its deadline has passed).
		return context.DeadlineExceeded
	}
	return nil
}

// Value answers from the real context once there is one, so that
// context.Cause finds its cause.
func (c *lazyDeadline) Value(key any) any {
	c.mu.Lock()
	real := c.real
	c.mu.Unlock()
	if real != nil {
		return real.Value(key)
	}
	return c.Context.Value(key)
}

// AfterFunc lets a context derived from this one follow it without a
// goroutine of its own (the context package looks for this method).
func (c *lazyDeadline) AfterFunc(f func()) (stop func() bool) {
	return context.AfterFunc(c.started(), f)
}
