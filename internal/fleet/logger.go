package fleet

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// go-redis logs through one process-wide logger, to stderr by default, and
// a Redis that is down makes it log every failed dial. The store says once
// itself that Redis is unreachable, so go-redis' own lines go to the log of
// the latest store at debug level.
var (
	redisLogger     atomic.Pointer[zap.Logger]
	redisLoggerOnce sync.Once
)

type debugLogging struct{}

// Printf implements go-redis' internal.Logging.
func (debugLogging) Printf(_ context.Context, format string, v ...any) {
	if l := redisLogger.Load(); l != nil {
		if ce := l.Check(zapcore.DebugLevel, "redis client"); ce != nil {
			ce.Write(zap.String("message", fmt.Sprintf(format, v...)))
		}
	}
}

func routeRedisLogs(l *zap.Logger) {
	redisLogger.Store(l)
	redisLoggerOnce.Do(func() { redis.SetLogger(debugLogging{}) })
}
