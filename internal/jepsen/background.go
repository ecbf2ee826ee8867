package jepsen

import "context"

// background is the goroutine a part of the run (the backups, the
// change-stream consumer) works in until Stop.
type background struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs run in the goroutine, with a context Stop ends.
func (g *background) start(run func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel, g.done = cancel, make(chan struct{})
	go func() {
		defer close(g.done)
		run(ctx)
	}()
}

// Stop ends the goroutine's context and waits for it to return; again,
// it returns at once.
func (g *background) Stop() {
	g.cancel()
	<-g.done
}
