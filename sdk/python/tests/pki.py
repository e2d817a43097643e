"""Certificates made in the test: a CA, server and client leaves with DNS,
IP and URI (SPIFFE) SANs, written as PEM files. Uses the ``cryptography``
module when it is installed (Debian's python3-cryptography), else the
``openssl`` command."""

import datetime
import ipaddress
import os
import subprocess
import tempfile

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # pragma: no cover - exercised where cryptography is absent
    x509 = None


class Leaf:
    def __init__(self, cert_file, key_file):
        self.cert_file, self.key_file = cert_file, key_file
        with open(cert_file, "rb") as f:
            self.cert_pem = f.read()
        with open(key_file, "rb") as f:
            self.key_pem = f.read()


class CA:
    """A CA in a temporary directory (removed by ``cleanup``)."""

    def __init__(self, name="test-ca"):
        self._tmp = tempfile.TemporaryDirectory(prefix="dsh-pki-")
        self.dir = self._tmp.name
        self.name = name
        self.cert_file = os.path.join(self.dir, name + ".pem")
        self.key_file = os.path.join(self.dir, name + "-key.pem")
        if x509 is not None:
            self._key = ec.generate_private_key(ec.SECP256R1())
            subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
            now = datetime.datetime.now(datetime.timezone.utc)
            self._cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                          .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                          .not_valid_before(now - datetime.timedelta(hours=1))
                          .not_valid_after(now + datetime.timedelta(days=1))
                          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                          .sign(self._key, hashes.SHA256()))
            self._write(self.cert_file, self._cert.public_bytes(serialization.Encoding.PEM))
            self._write(self.key_file, self._key_pem(self._key))
        else:
            self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                          "-days", "1", "-subj", "/CN=" + name, "-keyout", self.key_file, "-out", self.cert_file)
        with open(self.cert_file, "rb") as f:
            self.cert_pem = f.read()

    def cleanup(self):
        self._tmp.cleanup()

    def server(self, name, dns=("localhost",), ips=("127.0.0.1",), uris=()):
        return self._issue(name, dns, ips, uris, client=False)

    def client(self, name, dns=(), uris=()):
        return self._issue(name, dns, (), uris, client=True)

    @staticmethod
    def _key_pem(key):
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    @staticmethod
    def _write(path, data):
        with open(path, "wb") as f:
            f.write(data)

    def _openssl(self, *args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    def _issue(self, name, dns, ips, uris, client):
        cert_file = os.path.join(self.dir, name + ".pem")
        key_file = os.path.join(self.dir, name + "-key.pem")
        if x509 is not None:
            key = ec.generate_private_key(ec.SECP256R1())
            sans = ([x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
                    + [x509.UniformResourceIdentifier(u) for u in uris])
            usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
            now = datetime.datetime.now(datetime.timezone.utc)
            b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                 .issuer_name(self._cert.subject).public_key(key.public_key())
                 .serial_number(x509.random_serial_number())
                 .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
                 .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
            if sans:
                b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            cert = b.sign(self._key, hashes.SHA256())
            self._write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
            self._write(key_file, self._key_pem(key))
        else:
            csr = os.path.join(self.dir, name + ".csr")
            ext = os.path.join(self.dir, name + ".ext")
            alt = ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips] + [f"URI:{u}" for u in uris])
            with open(ext, "w") as f:
                if alt:
                    f.write(f"subjectAltName={alt}\n")
                f.write("extendedKeyUsage=" + ("clientAuth" if client else "serverAuth") + "\n")
            self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                          "-subj", "/CN=" + name, "-keyout", key_file, "-out", csr)
            self._openssl("x509", "-req", "-in", csr, "-CA", self.cert_file, "-CAkey", self.key_file,
                          "-CAcreateserial", "-days", "1", "-out", cert_file, "-extfile", ext)
        return Leaf(cert_file, key_file)
