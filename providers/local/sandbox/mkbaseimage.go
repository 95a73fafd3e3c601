//go:build ignore

// mkbaseimage builds (or finds) the machines' base image and prints its path:
//
//	go run ./providers/local/sandbox/mkbaseimage.go [-cache DIR]
//
// scripts/base-image.sh calls it; the cache dir defaults to $KLOUD_CACHE or /var/cache/kloud.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"github.com/kloud-dev/kloud/providers/local/sandbox"
)

func main() {
	cache := flag.String("cache", sandbox.DefaultCacheDir(), "cache directory")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	path, err := sandbox.EnsureBaseImage(ctx, *cache, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "base image:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}
