package worker

import (
	cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"
	"github.com/cyclone-workflows/cyclone/sdk/go/internal/testhook"
)

func init() {
	testhook.RunStep = func(worker any, claimed *cyclonev1.ClaimedStep) {
		w := worker.(*Worker)
		w.runStep(&Step{ClaimedStep: claimed, client: w.client, limits: w.opts.Limits})
	}
}
