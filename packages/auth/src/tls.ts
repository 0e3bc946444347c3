import { createHash, createPrivateKey, generateKeyPairSync, type KeyObject, randomBytes, sign, X509Certificate } from "node:crypto";
import { isIP } from "node:net";

/**
 * The TLS material of one Boxcar system: a private certificate authority and one certificate
 * for its NATS servers, for every link they serve (clients, routes between servers, WebSocket,
 * monitoring). Roles and clients verify the servers against the CA (`--tls-ca`); servers verify
 * each other's route connections against it too, so the certificate is issued for both ends of a
 * TLS connection (server and client authentication).
 *
 * Keys are ECDSA P-256 with SHA-256 signatures, which nats-server and Node both accept and which
 * take milliseconds to make. The certificates are X.509 v3, written here in DER (RFC 5280) with
 * Node's own key generation and signing: the CA lasts 10 years, a server certificate 2.
 */

const DAY_MS = 86_400_000;
const CA_DAYS = 3650;
const SERVER_DAYS = 730;

/**
 * The names a server certificate is issued for unless others are asked for: this machine, the
 * Compose cluster's servers (deploy/compose) and the NATS Helm chart's services in Kubernetes
 * (deploy/kubernetes: the service `nats`, the headless service `nats-headless` KEDA asks, and
 * the servers `nats-N.nats-headless` (N < 5), by short name and, in the `boxcar` namespace, by full name).
 */
export const DEFAULT_SERVER_HOSTS: readonly string[] = [
  "localhost",
  "127.0.0.1",
  "::1",
  "nats1",
  "nats2",
  "nats3",
  "nats",
  "nats-headless",
  // Each server by its short name (up to five): a one-label wildcard such as "*.nats-headless" is
  // accepted by Go (routes) but not by Node's check of a server's name (the roles).
  ...[0, 1, 2, 3, 4].map((i) => `nats-${i}.nats-headless`),
  "nats.boxcar.svc",
  "nats.boxcar.svc.cluster.local",
  "nats-headless.boxcar.svc",
  "nats-headless.boxcar.svc.cluster.local",
  "*.nats-headless.boxcar.svc",
  "*.nats-headless.boxcar.svc.cluster.local",
];

/** A certificate and its private key, in PEM. */
export interface Pem {
  cert: string;
  key: string;
}

/** A new certificate authority that may sign server certificates (and no other authority). */
export function newAuthority(commonName: string): Pem {
  const { publicKey, privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const name = distinguishedName(commonName);
  const cert = certificate({
    issuer: name,
    subject: name,
    days: CA_DAYS,
    publicKey,
    signingKey: privateKey,
    extensions: [
      extension(OID.basicConstraints, true, seq(bool(true), int(Buffer.from([0])))),
      extension(OID.keyUsage, true, keyUsage(KEY_CERT_SIGN | CRL_SIGN)),
      extension(OID.subjectKeyId, false, octets(keyId(publicKey))),
    ],
  });
  return { cert, key: pemOf(privateKey) };
}

/** A certificate for NATS servers reachable under `hosts` (names, `*.` wildcards or IP addresses), signed by `authority`. */
export function newServerCertificate(authority: Pem, hosts: readonly string[]): Pem {
  if (hosts.length === 0) throw new RangeError("a server certificate needs at least one host name or address");
  for (const host of hosts) {
    const problem = checkHost(host);
    if (problem) throw new RangeError(problem);
  }
  const ca = new X509Certificate(authority.cert);
  const caKey = createPrivateKey(authority.key);
  const { publicKey, privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const names = hosts.map((h) => (isIP(h) ? tagged(7, ipBytes(h)) : tagged(2, Buffer.from(h, "ascii"))));
  const cert = certificate({
    issuer: subjectOf(ca),
    subject: distinguishedName(hosts[0] as string),
    days: SERVER_DAYS,
    publicKey,
    signingKey: caKey,
    extensions: [
      extension(OID.basicConstraints, true, seq()),
      extension(OID.keyUsage, true, keyUsage(DIGITAL_SIGNATURE)),
      extension(OID.extKeyUsage, false, seq(oid(OID.serverAuth), oid(OID.clientAuth))),
      extension(OID.subjectAltName, false, seq(...names)),
      extension(OID.subjectKeyId, false, octets(keyId(publicKey))),
      extension(OID.authorityKeyId, false, seq(tagged(0, keyId(ca.publicKey)))),
    ],
  });
  return { cert, key: pemOf(privateKey) };
}

/** Undefined for a host a certificate may name (a DNS name, optionally after `*.`, or an IP address); else what is wrong with it. */
export function checkHost(host: string): string | undefined {
  if (isIP(host)) return undefined;
  if (/^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/i.test(host)) return undefined;
  return `${JSON.stringify(host)} is neither a host name (letters, digits, '-' and '.', optionally after "*.") nor an IP address`;
}

// --- X.509 in DER (RFC 5280), only what the two certificates above need ---

const OID = {
  ecPublicKey: "1.2.840.10045.2.1",
  ecdsaWithSha256: "1.2.840.10045.4.3.2",
  commonName: "2.5.4.3",
  organization: "2.5.4.10",
  basicConstraints: "2.5.29.19",
  keyUsage: "2.5.29.15",
  extKeyUsage: "2.5.29.37",
  subjectAltName: "2.5.29.17",
  subjectKeyId: "2.5.29.14",
  authorityKeyId: "2.5.29.35",
  serverAuth: "1.3.6.1.5.5.7.3.1",
  clientAuth: "1.3.6.1.5.5.7.3.2",
} as const;

const DIGITAL_SIGNATURE = 0x80;
const KEY_CERT_SIGN = 0x04;
const CRL_SIGN = 0x02;

interface CertificateSpec {
  issuer: Buffer;
  subject: Buffer;
  days: number;
  publicKey: KeyObject;
  signingKey: KeyObject;
  extensions: Buffer[];
}

function certificate(spec: CertificateSpec): string {
  const now = Date.now();
  const algorithm = seq(oid(OID.ecdsaWithSha256));
  const tbs = seq(
    tagged(0, int(Buffer.from([2])), true), // version 3
    int(serialNumber()),
    algorithm,
    spec.issuer,
    seq(time(new Date(now - 60_000)), time(new Date(now + spec.days * DAY_MS))),
    spec.subject,
    spec.publicKey.export({ type: "spki", format: "der" }),
    tagged(3, seq(...spec.extensions), true),
  );
  const signature = sign("sha256", tbs, spec.signingKey); // ECDSA-Sig-Value in DER
  const der = seq(tbs, algorithm, bitString(signature));
  return `-----BEGIN CERTIFICATE-----\n${(der.toString("base64").match(/.{1,64}/g) ?? []).join("\n")}\n-----END CERTIFICATE-----\n`;
}

function distinguishedName(commonName: string): Buffer {
  const rdn = (type: string, value: string) => set(seq(oid(type), utf8(value)));
  return seq(rdn(OID.organization, "Boxcar"), rdn(OID.commonName, commonName));
}

/** The issuer's subject as it is encoded in its certificate, so a verifier matches the two byte for byte. */
function subjectOf(ca: X509Certificate): Buffer {
  const tbs = children(children(ca.raw)[0] as Buffer);
  // TBSCertificate: [0] version, serial, signature algorithm, issuer, validity, subject, ...
  return tbs[5] as Buffer;
}

function extension(type: string, critical: boolean, value: Buffer): Buffer {
  return critical ? seq(oid(type), bool(true), octets(value)) : seq(oid(type), octets(value));
}

function keyUsage(bits: number): Buffer {
  return bitString(Buffer.from([bits]), 1);
}

/** The key identifier of RFC 5280 4.2.1.2 (1): SHA-1 of the public key's bits. */
function keyId(key: KeyObject): Buffer {
  const spki = children(key.export({ type: "spki", format: "der" }));
  const bits = (spki[1] as Buffer).subarray(headerLength(spki[1] as Buffer) + 1);
  return createHash("sha1").update(bits).digest();
}

function serialNumber(): Buffer {
  const bytes = randomBytes(16);
  bytes[0] = (bytes[0] as number) & 0x7f; // positive
  return bytes;
}

function ipBytes(ip: string): Buffer {
  if (isIP(ip) === 4) return Buffer.from(ip.split(".").map(Number));
  const [head = "", tail = ""] = ip.split("::");
  const groups = (s: string) => (s ? s.split(":") : []);
  const h = groups(head);
  const t = ip.includes("::") ? groups(tail) : [];
  const all = [...h, ...Array(8 - h.length - t.length).fill("0"), ...t];
  return Buffer.concat(all.map((g) => Buffer.from([parseInt(g, 16) >> 8, parseInt(g, 16) & 0xff])));
}

function pemOf(key: KeyObject): string {
  return key.export({ type: "pkcs8", format: "pem" }).toString();
}

function time(date: Date): Buffer {
  // UTCTime through 2049, GeneralizedTime after (RFC 5280 4.1.2.5).
  const iso = date.toISOString().replace(/[-:T]/g, "").slice(0, 14);
  return date.getUTCFullYear() < 2050 ? tlv(0x17, Buffer.from(`${iso.slice(2)}Z`)) : tlv(0x18, Buffer.from(`${iso}Z`));
}

const seq = (...items: Buffer[]) => tlv(0x30, Buffer.concat(items));
const set = (...items: Buffer[]) => tlv(0x31, Buffer.concat(items));
const bool = (value: boolean) => tlv(0x01, Buffer.from([value ? 0xff : 0]));
const octets = (value: Buffer) => tlv(0x04, value);
const utf8 = (value: string) => tlv(0x0c, Buffer.from(value, "utf8"));
const bitString = (value: Buffer, unused = 0) => tlv(0x03, Buffer.concat([Buffer.from([unused]), value]));

/** A context-specific tag: constructed (explicit, wrapping an encoding) or primitive (implicit, raw bytes). */
function tagged(n: number, content: Buffer, constructed = false): Buffer {
  return tlv((constructed ? 0xa0 : 0x80) | n, content);
}

function int(value: Buffer): Buffer {
  let v = value;
  while (v.length > 1 && v[0] === 0 && ((v[1] as number) & 0x80) === 0) v = v.subarray(1);
  return tlv(0x02, ((v[0] as number) & 0x80) !== 0 ? Buffer.concat([Buffer.from([0]), v]) : v);
}

function oid(dotted: string): Buffer {
  const [a = 0, b = 0, ...rest] = dotted.split(".").map(Number);
  const bytes = [40 * a + b];
  for (const n of rest) {
    const base128 = [n & 0x7f];
    for (let m = n >>> 7; m > 0; m >>>= 7) base128.unshift((m & 0x7f) | 0x80);
    bytes.push(...base128);
  }
  return tlv(0x06, Buffer.from(bytes));
}

function tlv(tag: number, content: Buffer): Buffer {
  const n = content.length;
  const length =
    n < 0x80 ? [n] : n < 0x100 ? [0x81, n] : n < 0x10000 ? [0x82, n >> 8, n & 0xff] : [0x83, n >> 16, (n >> 8) & 0xff, n & 0xff];
  return Buffer.concat([Buffer.from([tag, ...length]), content]);
}

function headerLength(der: Buffer): number {
  const first = der[1] as number;
  return first < 0x80 ? 2 : 2 + (first & 0x7f);
}

/** The encodings inside a constructed DER value, each with its own header. */
function children(der: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let at = headerLength(der);
  while (at < der.length) {
    const rest = der.subarray(at);
    const first = rest[1] as number;
    const size = first < 0x80 ? first : [...rest.subarray(2, 2 + (first & 0x7f))].reduce((a, b) => a * 256 + b, 0);
    const whole = headerLength(rest) + size;
    out.push(rest.subarray(0, whole));
    at += whole;
  }
  return out;
}
