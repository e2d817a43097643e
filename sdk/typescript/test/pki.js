// Certificates made in the test with the openssl command: a CA, server and
// client leaves with DNS, IP and URI (SPIFFE) SANs, as PEM files.
import { execFileSync } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'

const openssl = (...args) => execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] })

export class CA {
  constructor(name = 'test-ca') {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dsh-pki-'))
    this.certFile = path.join(this.dir, `${name}.pem`)
    this.keyFile = path.join(this.dir, `${name}-key.pem`)
    openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1',
      '-subj', `/CN=${name}`, '-keyout', this.keyFile, '-out', this.certFile)
    this.certPem = fs.readFileSync(this.certFile)
  }

  cleanup() {
    fs.rmSync(this.dir, { recursive: true, force: true })
  }

  server(name, { dns = ['localhost'], ips = ['127.0.0.1'], uris = [] } = {}) {
    return this.#issue(name, dns, ips, uris, 'serverAuth')
  }

  client(name, { dns = [], uris = [] } = {}) {
    return this.#issue(name, dns, [], uris, 'clientAuth')
  }

  #issue(name, dns, ips, uris, usage) {
    const f = (ext) => path.join(this.dir, `${name}${ext}`)
    const alt = [...dns.map((d) => `DNS:${d}`), ...ips.map((i) => `IP:${i}`), ...uris.map((u) => `URI:${u}`)].join(',')
    fs.writeFileSync(f('.ext'), `${alt ? `subjectAltName=${alt}\n` : ''}extendedKeyUsage=${usage}\n`)
    openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-subj', `/CN=${name}`,
      '-keyout', f('-key.pem'), '-out', f('.csr'))
    openssl('x509', '-req', '-in', f('.csr'), '-CA', this.certFile, '-CAkey', this.keyFile, '-CAcreateserial',
      '-days', '1', '-out', f('.pem'), '-extfile', f('.ext'))
    return { certFile: f('.pem'), keyFile: f('-key.pem'), certPem: fs.readFileSync(f('.pem')), keyPem: fs.readFileSync(f('-key.pem')) }
  }
}
