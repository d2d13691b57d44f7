// The web-push npm package as an app server: one notification, as its README shows, from a JSON
// request on stdin; prints {statusCode, headers, body} (or {error, statusCode, body}) as JSON.
'use strict';
const fs = require('fs');
const webpush = require('web-push');

const req = JSON.parse(fs.readFileSync(0, 'utf8'));
const options = {
  vapidDetails: { subject: req.subject, publicKey: req.vapidPublicKey, privateKey: req.vapidPrivateKey },
  TTL: req.ttl,
  contentEncoding: 'aes128gcm',
};
if (req.urgency) options.urgency = req.urgency;
if (req.topic) options.topic = req.topic;

webpush
  .sendNotification(req.subscription, Buffer.from(req.payloadBase64, 'base64'), options)
  .then((res) => {
    process.stdout.write(JSON.stringify({ statusCode: res.statusCode, headers: res.headers, body: res.body }));
  })
  .catch((err) => {
    process.stdout.write(JSON.stringify({ error: String(err.message || err), statusCode: err.statusCode, body: err.body }));
    process.exitCode = 1;
  });
