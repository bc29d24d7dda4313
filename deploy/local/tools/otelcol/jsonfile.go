package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/pdata/ptrace"
)

// jsonFileConfig is the exporter's whole configuration: where to append.
type jsonFileConfig struct {
	Path string `mapstructure:"path"`
}

// Validate runs when the collector loads its configuration, so a missing path fails at start.
func (c *jsonFileConfig) Validate() error {
	if c.Path == "" {
		return errors.New("path must be set")
	}
	return nil
}

func newJSONFileFactory() exporter.Factory {
	return exporter.NewFactory(
		component.MustNewType("jsonfile"),
		func() component.Config { return &jsonFileConfig{} },
		exporter.WithTraces(createJSONFileTraces, component.StabilityLevelDevelopment),
	)
}

func createJSONFileTraces(_ context.Context, _ exporter.Settings, cfg component.Config) (exporter.Traces, error) {
	c, ok := cfg.(*jsonFileConfig)
	if !ok {
		return nil, fmt.Errorf("jsonfile: unexpected config type %T", cfg)
	}
	return &jsonFileExporter{path: c.Path}, nil
}

// jsonFileExporter writes one OTLP/JSON ExportTraceServiceRequest per line. A line is written
// with a single write call under a lock, so a reader never sees two batches interleaved.
type jsonFileExporter struct {
	path string
	mu   sync.Mutex
	file *os.File
	enc  ptrace.JSONMarshaler
}

func (e *jsonFileExporter) Start(_ context.Context, _ component.Host) error {
	if err := os.MkdirAll(filepath.Dir(e.path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(e.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	e.file = f
	return nil
}

func (e *jsonFileExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.file == nil {
		return nil
	}
	err := e.file.Close()
	e.file = nil
	return err
}

func (e *jsonFileExporter) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: false}
}

func (e *jsonFileExporter) ConsumeTraces(_ context.Context, td ptrace.Traces) error {
	if td.SpanCount() == 0 {
		return nil // the stack's readiness probe posts an empty request
	}
	line, err := e.enc.MarshalTraces(td)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.file == nil {
		return errors.New("jsonfile: exporter is shut down")
	}
	_, err = e.file.Write(append(line, '\n'))
	return err
}
