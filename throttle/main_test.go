package throttle

import (
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }
