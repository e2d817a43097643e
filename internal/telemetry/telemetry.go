// Package telemetry sets up OpenTelemetry for a dsh process and gives the
// services one vocabulary for spans and metrics: tracer and meter names, the
// GenAI semantic-convention attributes of model and tool calls, and the
// metric instruments (tokens, step latency, time to first chunk, tool
// latency, active sessions, NATS publish lag).
//
// Setup exports by OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT (or the
// per-signal OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _METRICS_ENDPOINT) is set;
// otherwise it installs no-op providers, so telemetry costs nothing. The
// standard OTEL_* variables are honoured: OTEL_SDK_DISABLED,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_EXPORTER and
// OTEL_METRICS_EXPORTER ("none" turns a signal off),
// OTEL_EXPORTER_OTLP[_TRACES|_METRICS]_PROTOCOL ("grpc" or
// "http/protobuf", the default), OTEL_TRACES_SAMPLER and the exporters' own
// endpoint, header, timeout and TLS variables. The W3C trace-context and
// baggage propagators are installed in every case, so a process that does
// not export still passes trace context through its gRPC hops. Call Setup
// before building gRPC servers and clients: internal/grpcserver installs the
// otelgrpc handlers only when a recording provider is set (or pass it
// grpcserver.TracingFor(t.Tracing || t.Metering)).
//
// # Shutdown
//
// Telemetry.Shutdown flushes pending spans and metrics and stops the
// exporters; call it last, after the servers and NATS have drained.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every dsh tracer and meter.
const ScopeName = "github.com/dsh-dev/dsh"

// Config configures Setup.
type Config struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME overrides it.
	ServiceName string
	// ServiceVersion is service.version; optional.
	ServiceVersion string
	// Logger receives exporter errors. Required.
	Logger *slog.Logger
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
	// SpanProcessors, when set, are used instead of any OTLP span exporter
	// (tests pass a tracetest.SpanRecorder here).
	SpanProcessors []sdktrace.SpanProcessor
	// MetricReaders, when set, are used instead of any OTLP metric exporter
	// (tests pass an sdkmetric.ManualReader here).
	MetricReaders []sdkmetric.Reader
	// ExtraMetricReaders are added to the metric readers (OTLP or
	// MetricReaders) and turn metering on by themselves: the Prometheus
	// reader of --debug-addr (internal/debugserver).
	ExtraMetricReaders []sdkmetric.Reader
	// NoGlobal leaves the otel global providers alone.
	NoGlobal bool
}

// Telemetry holds the providers of one process.
type Telemetry struct {
	// TracerProvider is the process tracer provider (no-op when not exporting).
	TracerProvider trace.TracerProvider
	// MeterProvider is the process meter provider (no-op when not exporting).
	MeterProvider metric.MeterProvider
	// Tracing and Metering say whether each signal is recorded.
	Tracing, Metering bool

	shutdowns []func(context.Context) error
}

// Setup builds the providers from cfg and the environment and, unless
// cfg.NoGlobal, installs them (and the propagators) as the otel globals that
// otelgrpc and the helpers of this package use.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Telemetry{
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  metricnoop.NewMeterProvider(),
	}
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	if !cfg.NoGlobal {
		otel.SetTextMapPropagator(prop)
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
			cfg.Logger.Warn("opentelemetry", "err", err)
		}))
	}
	disabled := strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true")
	traceOn := len(cfg.SpanProcessors) > 0 ||
		(!disabled && signalOn(getenv, "TRACES"))
	otlpMetrics := !disabled && signalOn(getenv, "METRICS")
	metricOn := len(cfg.MetricReaders) > 0 || len(cfg.ExtraMetricReaders) > 0 || otlpMetrics

	if traceOn || metricOn {
		res, err := newResource(ctx, cfg)
		if err != nil {
			return nil, err
		}
		if traceOn {
			procs := cfg.SpanProcessors
			if len(procs) == 0 {
				exp, err := traceExporter(ctx, getenv)
				if err != nil {
					return nil, err
				}
				procs = []sdktrace.SpanProcessor{sdktrace.NewBatchSpanProcessor(exp)}
			}
			opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
			for _, p := range procs {
				opts = append(opts, sdktrace.WithSpanProcessor(p))
			}
			tp := sdktrace.NewTracerProvider(opts...)
			t.TracerProvider, t.Tracing = tp, true
			t.shutdowns = append(t.shutdowns, tp.Shutdown)
		}
		if metricOn {
			readers := cfg.MetricReaders
			if len(readers) == 0 && otlpMetrics {
				exp, err := metricExporter(ctx, getenv)
				if err != nil {
					return nil, errors.Join(err, t.Shutdown(ctx))
				}
				readers = []sdkmetric.Reader{sdkmetric.NewPeriodicReader(exp)}
			}
			opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
			for _, r := range append(readers, cfg.ExtraMetricReaders...) {
				opts = append(opts, sdkmetric.WithReader(r))
			}
			mp := sdkmetric.NewMeterProvider(opts...)
			t.MeterProvider, t.Metering = mp, true
			t.shutdowns = append(t.shutdowns, mp.Shutdown)
		}
	}
	if !cfg.NoGlobal {
		otel.SetTracerProvider(t.TracerProvider)
		otel.SetMeterProvider(t.MeterProvider)
	}
	return t, nil
}

// signalOn reports whether OTLP export of a signal ("TRACES", "METRICS") is
// configured: an endpoint is set and the signal's exporter is not "none".
func signalOn(getenv func(string) string, signal string) bool {
	if exp := strings.TrimSpace(getenv("OTEL_" + signal + "_EXPORTER")); exp == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

func protocol(getenv func(string) string, signal string) (string, error) {
	p := getenv("OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL")
	if p == "" {
		p = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch p {
	case "", "http/protobuf":
		return "http/protobuf", nil
	case "grpc":
		return "grpc", nil
	default:
		return "", fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q is not supported (use grpc or http/protobuf)", p)
	}
}

func traceExporter(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	p, err := protocol(getenv, "TRACES")
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if p == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: otlp trace exporter (%s): %w", p, err)
	}
	return exp, nil
}

func metricExporter(ctx context.Context, getenv func(string) string) (sdkmetric.Exporter, error) {
	p, err := protocol(getenv, "METRICS")
	if err != nil {
		return nil, err
	}
	var exp sdkmetric.Exporter
	if p == "grpc" {
		exp, err = otlpmetricgrpc.New(ctx)
	} else {
		exp, err = otlpmetrichttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: otlp metric exporter (%s): %w", p, err)
	}
	return exp, nil
}

func newResource(ctx context.Context, cfg Config) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithTelemetrySDK(), resource.WithHost(), resource.WithProcessPID()}
	base := []attribute.KeyValue{}
	if cfg.ServiceName != "" {
		base = append(base, semconv.ServiceName(cfg.ServiceName))
	}
	if cfg.ServiceVersion != "" {
		base = append(base, semconv.ServiceVersion(cfg.ServiceVersion))
	}
	// Later options win: the environment overrides the configured name.
	opts := append([]resource.Option{resource.WithSchemaURL(semconv.SchemaURL), resource.WithAttributes(base...)}, attrs...)
	opts = append(opts, resource.WithFromEnv())
	res, err := resource.New(ctx, opts...)
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

// Shutdown flushes and stops the exporters. It is bounded by ctx and safe to
// call on a no-op Telemetry.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var errs []error
	for i := len(t.shutdowns) - 1; i >= 0; i-- {
		if err := t.shutdowns[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	t.shutdowns = nil
	return errors.Join(errs...)
}

// ShutdownTimeout is a sensible bound for Shutdown at process exit.
const ShutdownTimeout = 5 * time.Second
