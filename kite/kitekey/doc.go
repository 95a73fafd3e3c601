// Package kitekey holds Kloud's credentials: Ed25519 signing keys with a kid, the kite.key file,
// and the five kinds of JWT (golang-jwt/v5) that kites present in kite.handshake — kite keys,
// agent keys, plugin keys, tokens and sessions — with their verification and a
// kite.Authenticator.
//
// Start reading at Verifier (verifier.go): it states every check, in order. Signer mints what
// Verifier accepts; Authenticator plugs Verifier into package kite. Keys come from a KeySource:
// kontrol uses a Keyring (keyring.go) over a KeyStore — FileStore/FileKeyring in the data
// directory now, the Mongo store later — and other kites use RemoteKeys, which fetches and caches
// kontrol's public keys. WriteFile, ReadFile, ParseKeyFile and ParseUnverified handle kite.key files.
//
// Compared with Koding's kite keys (docs/ARCHITECTURE.md §3):
//
//   - Ed25519 (alg EdDSA) only, chosen by the kid in the header; the key is never taken from the
//     token. Every other alg, "none" and HS256/RS256 confusion included, is rejected.
//   - Every JWT carries a "kind" claim (kiteKey, agentKey, token, session), so one can never
//     stand in for another.
//   - A machine's agent gets an agent key (kind agentKey, AgentKeyClaims): sub "machine:<id>"
//     (never a username), jti the agent's kite id (AgentIDPrefix + random), and the owner,
//     machine and stack ids as claims. It proves "the agent of that machine" and nothing else:
//     Authenticator accepts it only where Agents is set (kontrol and kloud) and gives it a
//     Principal of Type KindAgentKey, which servers refuse for every method but their
//     agent-facing ones (AgentGate, default deny). Kite keys minted for agents before agent keys
//     had a kind (kiteKey, sub = owner, jti with AgentIDPrefix) are treated the same way, so
//     they still register their machine but are no longer usable as their owner's key.
//   - An out-of-process provider (provider/plugin) gets a plugin key (kind pluginKey,
//     PluginKeyClaims): sub "provider:<name>", jti PluginIDPrefix + random, optional exp. It
//     proves "the plugin serving provider NAME" and nothing else: Authenticator accepts it only
//     where Plugins is set (kloud) and gives it a Principal of Type KindPluginKey.
//   - Agents and plugins are restricted principals: Gate(h, allow...) refuses them with -32002 for
//     every method whose route did not open it to their kind (default deny), so a plugin key can
//     call only what is routed with Gate(h, KindPluginKey). AgentGate and RefuseAgents are Gate's
//     older forms and refuse plugins too.
//   - A token names exactly one kite id in aud; there is no root or prefix audience. Tokens last
//     at most MaxTokenTTL (1h) from iat; sessions at most MaxSessionTTL.
//   - Kite keys do not expire but are revocable by jti (the kite id) through a Revoker, and stop
//     verifying when their signing key is retired.
//
// Every rejection wraps kite.ErrAuth (code -32001) and a reason sentinel (ErrExpired,
// ErrWrongAudience, ...) and says what was wrong in words.
//
// Differences from the first sketch of this API: Keyring.Rotate and Retire take a ctx (they write
// to the store); Signer has an optional Current func so it can follow a Keyring's rotation;
// PublicKey carries kty ("OKP") so it is a real JWK; the keyring logic (Keyring) is separate from
// its storage (KeyStore), and FileKeyring is a Keyring on a FileStore.
package kitekey
