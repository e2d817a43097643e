// Command weatherhost is a third-party dsh toolhost written with the Go SDK.
package main

import (
	"cmp"
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/dsh-dev/dsh/sdk/go/toolsdk"
)

type Args struct {
	City  string `json:"city" jsonschema:"required,description=City name"`
	Units string `json:"units" jsonschema:"enum=metric|imperial"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	weather := toolsdk.Define("weather", "Current weather for a city.", func(_ context.Context, _ *toolsdk.Call, a Args) (toolsdk.Result, error) {
		return toolsdk.Text("Sunny, " + cmp.Or(map[string]string{"imperial": "72°F"}[a.Units], "22°C") + " in " + a.City), nil
	}, toolsdk.AlwaysConcurrencySafe())
	if err := toolsdk.Serve(ctx, cmp.Or(os.Getenv("DSH_LISTEN"), "127.0.0.1:7710"), weather); err != nil {
		log.Fatal(err)
	}
}
