package pglimitgrpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pglimit/cooldown/internal/onerror"
	"github.com/pglimit/cooldown/internal/onpglimit/observe"
	"github.com/pglimit/cooldown/pglimit"
)

// ErrInvalidConfig reports a [Config] the interceptors cannot use.
var ErrInvalidConfig = errors.New("pglimitgrpc: invalid config")

// ErrorPolicy says what a call gets when the limiter fails (database
// down, decision timed out). It is the HTTP middleware's
// (pglimithttp.ErrorPolicy), and has the same names.
type ErrorPolicy = onerror.Policy

const (
	// Unavailable fails the call with codes.Unavailable and a RetryInfo of
	// the shortest interval between two units of the limiter's limits. It
	// is the default: the failure is the server's, so ResourceExhausted
	// would tell a client it broke a quota it did not break, and failing
	// open would drop the protection from the calls a limit guards.
	Unavailable = onerror.Unavailable

	// FailOpen lets the call through, unlimited.
	FailOpen = onerror.FailOpen

	// FailClosed refuses the call as if the key had exhausted its limits:
	// codes.ResourceExhausted with a RetryInfo of the longest wait the
	// limits can impose, and an ErrorInfo of reason
	// "RATE_LIMITER_UNAVAILABLE", which tells it from a refusal.
	FailClosed = onerror.FailClosed
)

// KeyFunc returns the key a call of method (its full name,
// "/package.Service/Method") is limited by. An error fails the call with
// codes.InvalidArgument, and nothing is consumed.
type KeyFunc func(ctx context.Context, method string) (string, error)

// PeerAddress keys a call by the address of the connection's peer: its IP
// for IPv4, its /64 prefix for IPv6 (one host usually holds a whole /64),
// or the network's name ("unix") for an address that is not an IP. It
// reads no metadata, which any client can write: behind a proxy, every
// call has the proxy's address, and a KeyFunc of your own should read what
// the proxy vouches for. It is the default.
func PeerAddress(ctx context.Context, _ string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", errors.New("the call has no peer")
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return p.Addr.Network(), nil
	}
	a := ap.Addr().Unmap()
	if a.Is4() {
		return a.String(), nil
	}
	return netip.PrefixFrom(a, 64).Masked().String(), nil
}

// Metadata keys a call by the first value of the incoming metadata name
// (an API key, a tenant id), which the client must send.
func Metadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		v := md.Get(name)
		if len(v) == 0 {
			return "", fmt.Errorf("no %q metadata", name)
		}
		return v[0], nil
	}
}

// PeerCertificate keys a call by the identity in the client's TLS
// certificate, as the server verified it (a tls.Config whose ClientAuth is
// VerifyClientCertIfGiven or RequireAndVerifyClientCert): the
// certificate's first URI, such as a SPIFFE ID, or else its subject's
// common name. A call without a verified certificate has no key, so it
// fails with InvalidArgument.
func PeerCertificate(ctx context.Context, _ string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", errors.New("the call has no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", errors.New("the call has no verified client certificate")
	}
	c := info.State.VerifiedChains[0][0]
	switch {
	case len(c.URIs) > 0:
		return c.URIs[0].String(), nil
	case c.Subject.CommonName != "":
		return c.Subject.CommonName, nil
	}
	return "", errors.New("the client certificate names no URI and no common name")
}

// Method keys a call by its method: one budget per method, shared by every
// caller.
func Method(_ context.Context, method string) (string, error) { return method, nil }

// Outcome is what the interceptors did with a call. The words are those of
// pglimithttp's events and of the metrics (pglimitprom, pglimitotel).
type Outcome string

// Outcomes reported in [Event.Outcome].
const (
	OutcomeAdmitted    Outcome = observe.Admitted    // passed to the handler
	OutcomeRefused     Outcome = observe.Refused     // ResourceExhausted: a limit refused the key
	OutcomeBadKey      Outcome = observe.BadKey      // InvalidArgument: no valid key for the call
	OutcomeFailOpen    Outcome = observe.FailOpen    // limiter failed; passed to the handler
	OutcomeFailClosed  Outcome = observe.FailClosed  // limiter failed; ResourceExhausted
	OutcomeUnavailable Outcome = observe.Unavailable // limiter failed; Unavailable
	OutcomeExempt      Outcome = observe.Exempt      // an Exempt method: passed to the handler, no decision
	OutcomeShadowed    Outcome = observe.Shadowed    // a refusal the limiter's shadow mode let through
	OutcomeCanceled    Outcome = observe.Canceled    // the client gave up while the limiter decided
	OutcomeBusy        Outcome = observe.Busy        // ResourceExhausted: every slot of the key was held (the concurrency interceptors)
)

// Event describes one call's decision, for logging and metrics.
type Event struct {
	Method   string // the full method name
	Key      string // the call's key; "" when none was extracted
	Outcome  Outcome
	Decision pglimit.Decision // zero unless the limiter decided
	Err      error            // the key or limiter error, if any
}

// Config configures the interceptors. A nil *Config means the defaults.
type Config struct {
	// Key returns a call's key. Defaults to [PeerAddress].
	Key KeyFunc

	// Methods gives methods, by full name ("/package.Service/Method"), a
	// limiter of their own instead of the interceptor's.
	Methods map[string]pglimit.Limiter

	// Exempt lists methods, by full name, that pass without a decision,
	// such as health checks.
	Exempt []string

	// OnError is what a call gets when its limiter fails. Defaults to
	// [Unavailable].
	OnError ErrorPolicy

	// Logger receives limiter failures, at most one line per LogInterval
	// (default 10 s), each counting the failures it left out. Defaults to
	// slog.Default().
	Logger      *slog.Logger
	LogInterval time.Duration

	// OnDecision, when set, is called once per call with what happened,
	// before the handler runs (or the call fails). It must be safe for
	// concurrent use, and quick.
	OnDecision func(ctx context.Context, ev Event)

	// IDMetadata, when set, names the request metadata key (such as
	// "idempotency-key") whose value is the call's decision id
	// ([pglimit.WithID]): a retried call with the same value, on any
	// instance, within the limiter's IDRetention, is charged nothing and
	// decided as the first. A value that is not a valid id
	// ([pglimit.ValidateID]), or the key given twice, fails the call with
	// codes.InvalidArgument and charges nothing; a call without it is
	// decided as usual. A call an interceptor inside this one fails is
	// given back by its id ([pglimit.RefundID]). With the Levels
	// interceptors the id is the call's at every level ([pglimit.AllowAll]);
	// not with the concurrency interceptors. Defaults to "": none.
	IDMetadata string

	// Flow, for the concurrency interceptors alone
	// ([UnaryServerConcurrency]), returns a call's flow: a call then waits
	// for a slot as a waiter of its flow, up to FlowWait. Defaults to nil:
	// a call takes a free slot or is refused.
	Flow FlowFunc

	// FlowWait bounds how long a call with a Flow or a Level waits for a
	// slot, within the call's deadline. Defaults to 10 s; needs a Flow or
	// a Level.
	FlowWait time.Duration

	// Level, for the concurrency interceptors alone, returns a call's
	// priority level, one of the semaphore's pglimitsem.Config.Levels: a
	// call then waits for a slot of its level, up to FlowWait. An error
	// fails the call with codes.InvalidArgument. Not with Flow. Defaults
	// to nil: no level.
	Level func(ctx context.Context, method string) (string, error)
}

// UnaryServerInterceptor limits unary calls with lim, or the limiter
// cfg.Methods gives their method: a call is decided before its handler
// runs, and refused with codes.ResourceExhausted, a RetryInfo (how long to
// wait) and a QuotaFailure (the limits that refused it). The same delay is
// sent as the trailer grpc-retry-pushback-ms, which gRPC's own retries
// honour.
//
// Chained with other interceptors of this package, a call one of them
// fails itself is charged by none (package doc, "Chaining interceptors").
func UnaryServerInterceptor(lim pglimit.Limiter, cfg *Config) (grpc.UnaryServerInterceptor, error) {
	l, err := newLimiter(lim, cfg)
	if err != nil {
		return nil, err
	}
	return unary(l, l.decide), nil
}

// decideFunc decides a call of method, and returns the units it took,
// or the status that fails it; trailer sets the call's trailer.
type decideFunc func(ctx context.Context, method string, trailer func(metadata.MD)) ([]held, error)

// unary is the unary interceptor of l that asks decide before every call.
// A call that an interceptor of this package inside it fails gets back
// what decide took.
func unary(l *limiter, decide decideFunc) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		took, err := decide(ctx, info.FullMethod, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) })
		if err != nil {
			failedHere(ctx)
			return nil, err
		}
		if len(took) == 0 {
			return handler(ctx, req)
		}
		ctx, c := withChain(ctx)
		resp, err := handler(ctx, req)
		if c.failed.Load() {
			l.giveBack(ctx, info.FullMethod, took)
		}
		return resp, err
	}
}

// stream is the stream interceptor of l that asks decide when a stream
// opens, and gives back what it took as unary does.
func stream(l *limiter, decide decideFunc) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		took, err := decide(ctx, info.FullMethod, ss.SetTrailer)
		if err != nil {
			failedHere(ctx)
			return err
		}
		if len(took) == 0 {
			return handler(srv, ss)
		}
		cctx, c := withChain(ctx)
		if cctx != ctx {
			ss = &chainStream{ServerStream: ss, ctx: cctx}
		}
		err = handler(srv, ss)
		if c.failed.Load() {
			l.giveBack(ctx, info.FullMethod, took)
		}
		return err
	}
}

// StreamServerInterceptor limits streams as [UnaryServerInterceptor] limits
// unary calls: one decision when a stream opens.
func StreamServerInterceptor(lim pglimit.Limiter, cfg *Config) (grpc.StreamServerInterceptor, error) {
	l, err := newLimiter(lim, cfg)
	if err != nil {
		return nil, err
	}
	return stream(l, l.decide), nil
}

// RetryDelay returns how long err, a refusal by these interceptors (or any
// status with a RetryInfo), asks the client to wait before it calls again.
func RetryDelay(err error) (time.Duration, bool) {
	s, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range s.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// limiter is the interceptors' state.
type limiter struct {
	key      KeyFunc
	def      *guard
	byMethod map[string]*guard
	exempt   map[string]bool
	onError  ErrorPolicy
	failures *onerror.Log
	report   func(ctx context.Context, ev Event) // never nil
	idKey    string                              // Config.IDMetadata, lower case; "" for none
}

// guard is a limiter with what its policy implies for refusals.
type guard struct {
	lim         pglimit.Limiter
	limits      []pglimit.Limit
	longest     time.Duration // the longest wait its limits impose
	unavailable time.Duration // the shortest interval between two units
}

func newGuard(lim pglimit.Limiter) (*guard, error) {
	if lim == nil {
		return nil, errors.New("nil limiter")
	}
	p := lim.Policy()
	if len(p.Limits) == 0 {
		return nil, errors.New("the limiter's policy has no limits")
	}
	g := &guard{lim: lim, limits: p.Limits, longest: p.LongestWait(), unavailable: p.Limits[0].Period / time.Duration(p.Limits[0].Rate)}
	for _, l := range p.Limits {
		g.unavailable = min(g.unavailable, l.Period/time.Duration(l.Rate))
	}
	return g, nil
}

func newLimiter(lim pglimit.Limiter, cfg *Config) (*limiter, error) {
	def, err := newGuard(lim)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := noFlow(cfg); err != nil {
		return nil, err
	}
	l, err := newBase(cfg)
	if err != nil {
		return nil, err
	}
	l.def = def
	for m, lim := range cmp.Or(cfg, &Config{}).Methods {
		if !validMethod(m) {
			return nil, fmt.Errorf("%w: Methods: %q is not a full method name (/package.Service/Method)", ErrInvalidConfig, m)
		}
		if l.byMethod[m], err = newGuard(lim); err != nil {
			return nil, fmt.Errorf("%w: Methods[%q]: %w", ErrInvalidConfig, m, err)
		}
	}
	return l, nil
}

// newBase is the state of cfg that every interceptor of this package
// keeps: the key, the exempt methods, the failure policy and its log,
// the report and the id key; it limits nothing.
func newBase(cfg *Config) (*limiter, error) {
	c := cmp.Or(cfg, &Config{})
	if !c.OnError.Valid() {
		return nil, fmt.Errorf("%w: OnError: unknown %s", ErrInvalidConfig, c.OnError)
	}
	key := c.Key
	if key == nil {
		key = PeerAddress
	}
	l := &limiter{
		key: key, byMethod: map[string]*guard{}, exempt: map[string]bool{}, onError: c.OnError,
		failures: &onerror.Log{Logger: c.Logger, Interval: cmp.Or(c.LogInterval, 10*time.Second), Message: "pglimitgrpc: limiter failed"},
		report:   c.OnDecision,
	}
	if l.report == nil {
		l.report = func(context.Context, Event) {}
	}
	if c.IDMetadata != "" {
		l.idKey = strings.ToLower(c.IDMetadata)
		if strings.HasPrefix(l.idKey, "grpc-") || strings.HasSuffix(l.idKey, "-bin") || strings.Trim(l.idKey, "abcdefghijklmnopqrstuvwxyz0123456789-_.") != "" {
			return nil, fmt.Errorf("%w: IDMetadata: %q is not an ASCII metadata key of the application's", ErrInvalidConfig, c.IDMetadata)
		}
	}
	for _, m := range c.Exempt {
		if !validMethod(m) {
			return nil, fmt.Errorf("%w: Exempt: %q is not a full method name (/package.Service/Method)", ErrInvalidConfig, m)
		}
		l.exempt[m] = true
	}
	return l, nil
}

// decisionID is ctx with the decision id the call's metadata carries
// under IDMetadata, and the id ("" for none). An invalid id is reported
// as a bad key of the call of method on key, and fails it with
// codes.InvalidArgument.
func (l *limiter) decisionID(ctx context.Context, method, key string) (context.Context, string, error) {
	id, err := l.id(ctx)
	switch {
	case err != nil:
		l.report(ctx, Event{Method: method, Key: key, Outcome: OutcomeBadKey, Err: err})
		return ctx, "", status.Errorf(codes.InvalidArgument, "pglimitgrpc: the call's decision id: %v", err)
	case id != "":
		return pglimit.WithID(ctx, id), id, nil
	}
	return ctx, "", nil
}

// id is the decision id the call's metadata carries under IDMetadata, ""
// for none; an error wrapping pglimit.ErrInvalidID for an invalid one.
func (l *limiter) id(ctx context.Context) (string, error) {
	if l.idKey == "" {
		return "", nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(l.idKey)
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1:
		return "", fmt.Errorf("%w: %s given %d times", pglimit.ErrInvalidID, l.idKey, len(values))
	}
	if err := pglimit.ValidateID(values[0]); err != nil {
		return "", err
	}
	return values[0], nil
}

// validMethod reports whether m looks like a full method name.
func validMethod(m string) bool {
	svc, method, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
	return strings.HasPrefix(m, "/") && ok && svc != "" && method != "" && !strings.Contains(method, "/")
}

// decide decides a call of method, and returns the units it took, or the
// status that fails it; trailer sets the call's trailer.
func (l *limiter) decide(ctx context.Context, method string, trailer func(metadata.MD)) ([]held, error) {
	if l.exempt[method] {
		l.report(ctx, Event{Method: method, Outcome: OutcomeExempt})
		return nil, nil
	}
	g := l.byMethod[method]
	if g == nil {
		g = l.def
	}
	key, err := l.key(ctx, method)
	if err == nil {
		err = pglimit.ValidateKey(key)
	}
	if err != nil {
		l.report(ctx, Event{Method: method, Outcome: OutcomeBadKey, Err: err})
		return nil, status.Errorf(codes.InvalidArgument, "pglimitgrpc: the call's rate limit key: %v", err)
	}
	dctx, id, err := l.decisionID(ctx, method, key)
	if err != nil {
		return nil, err
	}
	d, err := g.lim.Allow(dctx, key)
	ev := Event{Method: method, Key: key, Decision: d, Err: err}
	switch {
	case err != nil && ctx.Err() != nil:
		// The client gave up: no failure of the limiter.
		ev.Outcome = OutcomeCanceled
		l.report(ctx, ev)
		return nil, status.FromContextError(ctx.Err()).Err()
	case err != nil:
		l.failures.Record(time.Now(), "method", method, "key", key, "err", err)
		ev.Outcome = failOutcome(l.onError)
		l.report(ctx, ev)
		return nil, l.fail(g, trailer)
	case d.Allowed:
		ev.Outcome = OutcomeAdmitted
		if d.Shadow {
			ev.Outcome = OutcomeShadowed
		}
		l.report(ctx, ev)
		if id != "" {
			return holdsID(nil, g.lim, id, d), nil
		}
		return holds(nil, g.lim, d), nil
	}
	ev.Outcome = OutcomeRefused
	l.report(ctx, ev)
	violated := d.Violated()
	if len(violated) == 0 {
		violated = []pglimit.Limit{d.Limit}
	}
	return nil, refusal(violated, d.RetryAfter, trailer, nil)
}

// failOutcome is the outcome of a call whose limiter failed under policy p.
func failOutcome(p ErrorPolicy) Outcome {
	switch p {
	case FailOpen:
		return OutcomeFailOpen
	case FailClosed:
		return OutcomeFailClosed
	}
	return OutcomeUnavailable
}

// fail is what a call gets when g's limiter failed.
func (l *limiter) fail(g *guard, trailer func(metadata.MD)) error {
	switch l.onError {
	case FailOpen:
		return nil
	case FailClosed:
		return refusal(g.limits, g.longest, trailer, &errdetails.ErrorInfo{Reason: "RATE_LIMITER_UNAVAILABLE", Domain: "pglimit"})
	}
	return unavailable(g.unavailable)
}

// unavailable is codes.Unavailable, retry after wait. The cause stays in
// the server's log: it names hosts and SQL states a client has no
// business seeing.
func unavailable(wait time.Duration) error {
	return withDetails(status.New(codes.Unavailable, "pglimitgrpc: the rate limiter cannot decide right now; try again later"),
		&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
}

// refusal is codes.ResourceExhausted for the limits violated, retry after
// wait, with extra details if not nil.
func refusal(violated []pglimit.Limit, wait time.Duration, trailer func(metadata.MD), extra *errdetails.ErrorInfo) error {
	qf := &errdetails.QuotaFailure{}
	names := make([]string, 0, len(violated))
	for _, v := range violated {
		names = append(names, v.Name)
		qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{
			Subject:     "limit:" + v.Name,
			Description: fmt.Sprintf("%d per %s, burst %d", v.Rate, v.Period, v.Burst),
		})
	}
	return exhausted(names, qf, wait, trailer, extra)
}

// exhausted is codes.ResourceExhausted for the limits named, whose
// violations qf holds, retry after wait, with extra details if not nil.
func exhausted(names []string, qf *errdetails.QuotaFailure, wait time.Duration, trailer func(metadata.MD), extra *errdetails.ErrorInfo) error {
	trailer(metadata.Pairs("grpc-retry-pushback-ms", strconv.FormatInt(max(wait.Milliseconds(), 1), 10)))
	s := status.New(codes.ResourceExhausted, fmt.Sprintf("pglimitgrpc: refused by the %s limit; retry in %s",
		strings.Join(names, ", "), wait.Round(time.Millisecond)))
	details := []protoadapt.MessageV1{&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}, qf}
	if extra != nil {
		details = append(details, extra)
	}
	return withDetails(s, details...)
}

func withDetails(s *status.Status, details ...protoadapt.MessageV1) error {
	ds, err := s.WithDetails(details...)
	if err != nil {
		return s.Err() // details that do not marshal: the status alone
	}
	return ds.Err()
}
