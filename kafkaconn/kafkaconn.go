// Package kafkaconn says how kafkaonce connects to a Kafka cluster that
// asks for TLS or SASL. consumer.Config, outbox.RelayConfig and the
// kafkaonce CLI take the same two settings: a *tls.Config, and a SASL value
// from this package. docs/security.md walks through each mechanism.
package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Mechanism names a SASL mechanism, as Kafka does.
type Mechanism string

// The SASL mechanisms kafkaonce speaks.
const (
	// Plain sends Username and Password as they are: over TLS only, unless
	// SASL.AllowPlaintext says otherwise (see CheckOver).
	Plain Mechanism = "PLAIN"
	// ScramSHA256 and ScramSHA512 prove the password without sending it.
	ScramSHA256 Mechanism = "SCRAM-SHA-256"
	ScramSHA512 Mechanism = "SCRAM-SHA-512"
	// OAuthBearer sends a bearer token that SASL.Token returns.
	OAuthBearer Mechanism = "OAUTHBEARER"
	// AWSMSKIAM signs each connection with AWS credentials that SASL.AWS
	// returns, for Amazon MSK clusters with IAM access control.
	AWSMSKIAM Mechanism = "AWS_MSK_IAM"
)

// SASL authenticates every connection to the brokers.
type SASL struct {
	// Mechanism is the SASL mechanism the brokers expect. Required.
	Mechanism Mechanism
	// Username and Password authenticate Plain and the SCRAM mechanisms.
	Username, Password string
	// Token returns the bearer token for OAuthBearer. It is called for
	// every new connection, so it may refresh an expired token.
	Token func(ctx context.Context) (string, error)
	// AWS returns the credentials that sign AWSMSKIAM connections. It is
	// called for every new connection, so temporary credentials may
	// rotate. EnvAWSCredentials reads the standard environment variables.
	AWS func(ctx context.Context) (AWSCredentials, error)
	// AllowPlaintext lets Plain send the password over a connection
	// without TLS, where anyone on the path reads it: for a development
	// broker on loopback only. Without it, a Plain setting without TLS is
	// refused (see CheckOver).
	AllowPlaintext bool
}

// AWSCredentials sign AWS_MSK_IAM authentication.
type AWSCredentials struct {
	AccessKey, SecretKey string
	// SessionToken goes with temporary credentials (an assumed role).
	SessionToken string
}

// Check reports what is missing or wrong in s, naming the field and the
// fix. A nil SASL is valid: connections are not authenticated.
func (s *SASL) Check() error {
	if s == nil {
		return nil
	}
	switch s.Mechanism {
	case Plain, ScramSHA256, ScramSHA512:
		if s.Username == "" || s.Password == "" {
			return fmt.Errorf("SASL %s needs Username and Password", s.Mechanism)
		}
	case OAuthBearer:
		if s.Token == nil {
			return errors.New("SASL OAUTHBEARER needs Token, a function returning the bearer token")
		}
	case AWSMSKIAM:
		if s.AWS == nil {
			return errors.New("SASL AWS_MSK_IAM needs AWS, a function returning the credentials (kafkaconn.EnvAWSCredentials reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN)")
		}
	case "":
		return errors.New("SASL.Mechanism must be set: kafkaconn.Plain, ScramSHA256, ScramSHA512, OAuthBearer or AWSMSKIAM")
	default:
		return fmt.Errorf("SASL.Mechanism %q is not one kafkaonce speaks: use kafkaconn.Plain, ScramSHA256, ScramSHA512, OAuthBearer or AWSMSKIAM", s.Mechanism)
	}
	return nil
}

// CheckOver is Check, for connections that tlsCfg encrypts (nil: none). It
// refuses Plain without TLS, unless AllowPlaintext is set: PLAIN sends the
// password as it is, so without TLS anyone on the path reads it. The
// other mechanisms prove the password or sign, and need no TLS to keep it.
func (s *SASL) CheckOver(tlsCfg *tls.Config) error {
	if err := s.Check(); err != nil {
		return err
	}
	if s != nil && s.Mechanism == Plain && tlsCfg == nil && !s.AllowPlaintext {
		return errors.New("SASL PLAIN without TLS would send the password in clear: set TLS (kafkaconn.TLSConfig), use SCRAM-SHA-512, or, for a development broker on loopback only, set SASL.AllowPlaintext")
	}
	return nil
}

// EnvAWSCredentials returns the AWS credentials in the environment
// variables AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN,
// read at each call.
func EnvAWSCredentials(context.Context) (AWSCredentials, error) {
	c := AWSCredentials{AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"), SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY"), SessionToken: os.Getenv("AWS_SESSION_TOKEN")}
	if c.AccessKey == "" || c.SecretKey == "" {
		return c, errors.New("kafkaconn: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set for AWS_MSK_IAM")
	}
	return c, nil
}

// TLSFiles names the files of a TLS setup.
type TLSFiles struct {
	// CAFile holds the PEM certificates that sign the brokers'
	// certificates; empty: the system's roots.
	CAFile string
	// CertFile and KeyFile hold this client's PEM certificate and key, for
	// brokers that require client certificates (mTLS). Both or neither.
	CertFile, KeyFile string
	// ServerName overrides the name the brokers' certificates are checked
	// against; empty: the host of each broker address.
	ServerName string
}

// TLSConfig loads f into a TLS configuration (TLS 1.2 or later).
func TLSConfig(f TLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafkaconn: read the CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafkaconn: the CA file %s holds no PEM certificate", f.CAFile)
		}
		cfg.RootCAs = pool
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		return nil, errors.New("kafkaconn: a client certificate needs both CertFile and KeyFile")
	}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafkaconn: load the client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
