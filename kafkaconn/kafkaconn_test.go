package kafkaconn_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
)

func TestTLSConfig(t *testing.T) {
	t.Parallel()
	p := testenv.NewPKI(t)
	cert, key := p.Issue(t, "client", x509.ExtKeyUsageClientAuth)
	t.Run("LoadsTheCAAndTheClientCertificate", func(t *testing.T) {
		cfg, err := kafkaconn.TLSConfig(kafkaconn.TLSFiles{CAFile: p.CAFile, CertFile: cert, KeyFile: key, ServerName: "kafka-1"})
		require.NoError(t, err)
		require.Len(t, cfg.Certificates, 1)
		require.NotNil(t, cfg.RootCAs)
		require.Equal(t, "kafka-1", cfg.ServerName)
		require.GreaterOrEqual(t, cfg.MinVersion, uint16(0x0303), "TLS 1.2 at least")
	})
	t.Run("NoFilesMeansTheSystemRoots", func(t *testing.T) {
		cfg, err := kafkaconn.TLSConfig(kafkaconn.TLSFiles{})
		require.NoError(t, err)
		require.Nil(t, cfg.RootCAs)
		require.Empty(t, cfg.Certificates)
	})
	for _, c := range []struct {
		name  string
		files kafkaconn.TLSFiles
		want  string
	}{
		{"MissingCAFile", kafkaconn.TLSFiles{CAFile: filepath.Join(p.Dir, "nope.pem")}, "read the CA file"},
		{"CAFileWithoutACertificate", kafkaconn.TLSFiles{CAFile: key}, "holds no PEM certificate"},
		{"CertificateWithoutItsKey", kafkaconn.TLSFiles{CertFile: cert}, "needs both CertFile and KeyFile"},
		{"KeyOfAnotherCertificate", kafkaconn.TLSFiles{CertFile: p.CAFile, KeyFile: key}, "load the client certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := kafkaconn.TLSConfig(c.files)
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestSASLCheck(t *testing.T) {
	t.Parallel()
	token := func(context.Context) (string, error) { return "t", nil }
	aws := func(context.Context) (kafkaconn.AWSCredentials, error) { return kafkaconn.AWSCredentials{}, nil }
	for _, c := range []struct {
		name string
		sasl *kafkaconn.SASL
		want string // "" for valid
	}{
		{"None", nil, ""},
		{"Plain", &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "u", Password: "p"}, ""},
		{"PlainWithoutPassword", &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "u"}, "PLAIN needs Username and Password"},
		{"ScramSHA256", &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA256, Username: "u", Password: "p"}, ""},
		{"OAuthBearer", &kafkaconn.SASL{Mechanism: kafkaconn.OAuthBearer, Token: token}, ""},
		{"OAuthBearerWithoutToken", &kafkaconn.SASL{Mechanism: kafkaconn.OAuthBearer}, "needs Token"},
		{"AWSMSKIAM", &kafkaconn.SASL{Mechanism: kafkaconn.AWSMSKIAM, AWS: aws}, ""},
		{"AWSMSKIAMWithoutCredentials", &kafkaconn.SASL{Mechanism: kafkaconn.AWSMSKIAM}, "needs AWS"},
		{"NoMechanism", &kafkaconn.SASL{Username: "u", Password: "p"}, "SASL.Mechanism must be set"},
		{"UnknownMechanism", &kafkaconn.SASL{Mechanism: "plain"}, `"plain" is not one kafkaonce speaks`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.sasl.Check()
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.want)
		})
	}
}

// PLAIN sends the password as it is: without TLS only when asked to.
func TestSASLCheckOver(t *testing.T) {
	t.Parallel()
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	plain := func(allow bool) *kafkaconn.SASL {
		return &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "u", Password: "p", AllowPlaintext: allow}
	}
	for _, c := range []struct {
		name string
		sasl *kafkaconn.SASL
		tls  *tls.Config
		want string // "" for valid
	}{
		{"None", nil, nil, ""},
		{"PlainOverTLS", plain(false), tlsCfg, ""},
		{"PlainWithoutTLS", plain(false), nil, "SASL PLAIN without TLS would send the password in clear: set TLS"},
		{"PlainWithoutTLSAllowed", plain(true), nil, ""},
		{"ScramWithoutTLS", &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA512, Username: "u", Password: "p"}, nil, ""},
		{"CheckFailsFirst", &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "u"}, nil, "PLAIN needs Username and Password"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.sasl.CheckOver(c.tls)
			if c.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestEnvAWSCredentials(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	_, err := kafkaconn.EnvAWSCredentials(context.Background())
	require.ErrorContains(t, err, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set")
	t.Setenv("AWS_ACCESS_KEY_ID", "AKID")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_SESSION_TOKEN", "session")
	c, err := kafkaconn.EnvAWSCredentials(context.Background())
	require.NoError(t, err)
	require.Equal(t, kafkaconn.AWSCredentials{AccessKey: "AKID", SecretKey: "secret", SessionToken: "session"}, c)
}
