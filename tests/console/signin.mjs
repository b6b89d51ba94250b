// Drives the console in a real headless Chromium (Debian's `chromium`, through
// puppeteer-core: no browser download). Called by crates/cairn-cli/tests/it/server.rs, which
// starts `cairn serve`; prints one JSON line of what it saw.
//
// env: CONSOLE_URL, CONSOLE_TOKEN, CONSOLE_BAD_TOKEN, CHROMIUM (default
// /usr/bin/chromium), SHOT_DIR (screenshots).
import { drive } from "./drive.mjs";

const url = process.env.CONSOLE_URL;
const shots = process.env.SHOT_DIR;
await drive(async (browser, out) => {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 720 });
  const t0 = Date.now();
  await page.goto(url, { waitUntil: "load" });
  await page.waitForSelector("#token", { visible: true });
  out.first_paint_ms = Date.now() - t0;

  // A wrong token: a message in the page, still signed out.
  await page.type("#token", process.env.CONSOLE_BAD_TOKEN);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#alert:not([hidden])");
  out.bad_token_alert = await page.$eval("#alert", (e) => e.textContent);

  // The right one, typed and submitted from the keyboard.
  await page.$eval("#token", (e) => (e.value = ""));
  await page.type("#token", process.env.CONSOLE_TOKEN);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#datastore-rows tr");
  out.who = await page.$eval("#who-text", (e) => e.textContent);
  out.rows = await page.$$eval("#datastore-rows tr", (rows) =>
    rows.map((r) => {
      const o = { name: r.querySelector("th").textContent };
      for (const c of r.querySelectorAll("td")) o[c.dataset.field] = c.textContent;
      return o;
    }),
  );
  out.cookie_visible_to_scripts = await page.evaluate(() => document.cookie.includes("cairn_session"));
  if (shots) await page.screenshot({ path: `${shots}/console-datastores.png`, fullPage: true });

  // A reload keeps the session (the cookie), and the page learns its CSRF token again.
  await page.reload({ waitUntil: "load" });
  await page.waitForSelector("#datastore-rows tr");
  out.after_reload = await page.$eval("#who-text", (e) => e.textContent);

  // A phone-sized screen still shows the table (scrolling sideways).
  await page.setViewport({ width: 390, height: 800 });
  if (shots) await page.screenshot({ path: `${shots}/console-phone.png`, fullPage: true });

  // Sign out: back to the form.
  await page.click("#sign-out");
  await page.waitForSelector("#token", { visible: true });
  out.after_sign_out = await page.$eval("#alert", (e) => e.textContent);
});
