package relay_test

import (
	"testing"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }
