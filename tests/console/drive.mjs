// What every console script shares: Debian's chromium through puppeteer-core (no
// browser download), the server's self-signed certificate accepted, and one JSON
// line printed at the end with what the script saw (`ok` false and the error if a
// step failed), which tests/it/server.rs reads.
import puppeteer from "puppeteer-core";

export async function drive(steps) {
  const browser = await launch();
  const out = {};
  try {
    await steps(browser, out);
    out.ok = true;
  } catch (e) {
    out.ok = false;
    out.error = String(e && e.stack ? e.stack : e);
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(out));
}

// The page's alert after `action`: cleared first, so an old message is not taken
// for the new one.
export async function alertAfter(page, action) {
  await page.$eval("#alert", (e) => {
    e.hidden = true;
    e.textContent = "";
  });
  await action();
  await page.waitForSelector("#alert:not([hidden])", { timeout: 30000 });
  return page.$eval("#alert", (e) => e.textContent);
}

// Starts chromium. It starts in about a second, but a CI machine under load once
// took longer than puppeteer's 30 s twice in one run, so the wait is longer and a
// start that does not come is tried again, with what chromium printed kept for the
// error. D-Bus is switched off: without a bus chromium may wait on its timeouts.
async function launch() {
  let last;
  for (let attempt = 1; attempt <= 3; attempt++) {
    try {
      return await puppeteer.launch({
        executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
        headless: true,
        acceptInsecureCerts: true,
        timeout: 90000,
        env: { ...process.env, DBUS_SESSION_BUS_ADDRESS: "disabled:" },
        args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
      });
    } catch (e) {
      last = e;
      console.error(`chromium did not start (attempt ${attempt} of 3): ${e.message}`);
    }
  }
  throw last;
}
