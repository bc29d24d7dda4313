// Command reclaimd-otelcol is the OpenTelemetry Collector the local stack runs for the e2e tests:
// the core OTLP receiver (gRPC and HTTP) and one exporter of our own, jsonfile, that appends each
// batch it receives to a file as one line of OTLP/JSON. A test sends spans to the receiver and
// reads them back from the file by trace id; nothing else (no processors, no extensions) is built
// in, which keeps the build small on a 2-core machine.
package main

import (
	"fmt"
	"os"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// version is the collector release the module pins (go.mod); install.sh checks it against
// versions.env and stamps it in with -ldflags.
var version = "dev"

func factories() (otelcol.Factories, error) {
	otlp := otlpreceiver.NewFactory()
	jsonfile := newJSONFileFactory()
	return otelcol.Factories{
		Receivers: map[component.Type]receiver.Factory{otlp.Type(): otlp},
		Exporters: map[component.Type]exporter.Factory{jsonfile.Type(): jsonfile},
		Telemetry: otelconftelemetry.NewFactory(),
	}, nil
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "reclaimd-otelcol",
			Description: "OTLP receiver writing received spans to a JSON-lines file (reclaimd local stack)",
			Version:     version,
		},
		Factories: factories,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					fileprovider.NewFactory(),
					envprovider.NewFactory(),
				},
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "reclaimd-otelcol: %v\n", err)
		os.Exit(1)
	}
}
