package waiter_test

import (
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }
