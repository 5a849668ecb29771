// Preloaded into an MCP reference server under test (`node --require`):
// every server socket it opens listens on 127.0.0.1 at a port the kernel
// picks, and the port is printed as `LISTENING <port>` on stderr, so a
// test never guesses a free port and the server is never reachable from
// outside this machine.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const done = args.find((a) => typeof a === "function");
  const server = this;
  return listen.call(this, 0, "127.0.0.1", function () {
    process.stderr.write(`LISTENING ${server.address().port}\n`);
    if (done) done();
  });
};
